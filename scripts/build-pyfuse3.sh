#!/usr/bin/env bash
# pyfuse3 built from its pinned source with casfs's one patch, into the virtualenv of the
# given python (default .venv). Idempotent: nothing is done when it is installed already.
#
# The patch: pyfuse3 writes a read's reply (up to 1 MiB, copied into the kernel) with
# the GIL held, and meanwhile the daemon's read-ahead threads, done with a zstd or BLAKE3
# call, wait to take it back. Released around that one call, cold sequential reads ran
# 5-30% faster (docs/developer-notes.md, "Who holds the GIL in a cold sequential read").
# The buffer stays referenced by the handler until the call returns. Without the patch
# (a plain `pip install pyfuse3`) casfs works the same, only slower.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
VERSION=3.5.0   # casfs/fuse/fastwait.py was checked against this version's session loop
SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
PATCH=$PWD/scripts/pyfuse3-read-reply-nogil.patch
LABEL=$VERSION+casfs.1  # a local version: `pip list` shows which build is installed

have=$("$PY" -c 'from importlib import metadata; print(metadata.version("pyfuse3"))' 2>/dev/null || true)
[[ $have == "$LABEL" ]] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download --quiet --no-deps --no-binary :all: --dest "$work" "pyfuse3==$VERSION"
echo "$SHA256  $work/pyfuse3-$VERSION.tar.gz" | sha256sum --check --quiet
tar -xzf "$work/pyfuse3-$VERSION.tar.gz" -C "$work"
patch --quiet --directory "$work/pyfuse3-$VERSION" -p1 < "$PATCH"
SETUPTOOLS_SCM_PRETEND_VERSION=$LABEL "$PY" -m pip install --quiet --no-deps "$work/pyfuse3-$VERSION"
echo "build-pyfuse3.sh: installed pyfuse3 $LABEL"
