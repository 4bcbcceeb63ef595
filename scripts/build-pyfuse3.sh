#!/usr/bin/env bash
# pyfuse3 built from its pinned source with casfs's patches, into the virtualenv of the
# given python (default .venv). Idempotent: nothing is done when it is installed already.
#
# The patches:
#   - pyfuse3-read-reply-nogil.patch: pyfuse3 writes a read's reply (up to 1 MiB, copied
#     into the kernel) with the GIL held, and meanwhile the daemon's read-ahead threads,
#     done with a zstd or BLAKE3 call, wait to take it back. Released around that one
#     call, cold sequential reads ran 5-30% faster (docs/developer-notes.md, "Who holds
#     the GIL in a cold sequential read"). The buffer stays referenced by the handler
#     until the call returns.
#   - pyfuse3-passthrough.patch, only against libfuse >= 3.17 (the system's, or the one
#     scripts/build-libfuse.sh builds): an open or create reply may carry a backing id
#     (FileInfo.backing_id), and the INIT asks for passthrough when the operations set
#     enable_passthrough (pyfuse3.passthrough_granted says whether it was asked); and
#     FUSE_CAP_HANDLE_KILLPRIV_V2 when they set enable_killpriv_v2
#     (pyfuse3.killpriv_v2_granted), with the kernel's FATTR_KILL_SUIDGID shown to
#     setattr as SetattrFields.kill_suidgid (casfs.fuse.killpriv says what casfs does).
# Without them (a plain `pip install pyfuse3`) casfs works the same, only slower.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
VERSION=3.5.0   # casfs/fuse/fastwait.py was checked against this version's session loop
SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
PATCHES=("$PWD/scripts/pyfuse3-read-reply-nogil.patch")
# A local version, so `pip list` shows which build is installed. Bump N whenever a
# patch, VERSION or SHA256 changes: an installed build of the same label is kept.
LABEL=$VERSION+casfs.3
# libfuse with passthrough: its pkg-config directory (empty for the system's)
pcdir=$(./scripts/build-libfuse.sh)
env=()
if [[ -n $pcdir ]] || pkg-config --atleast-version=3.17 fuse3; then
    PATCHES+=("$PWD/scripts/pyfuse3-passthrough.patch")
    LABEL=$LABEL.passthrough
fi
if [[ -n $pcdir ]]; then
    libdir=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=libdir fuse3)
    env=(PKG_CONFIG_PATH="$pcdir" LDFLAGS="-Wl,-rpath,$libdir")  # found at run time too
fi

have=$("$PY" -c 'from importlib import metadata; print(metadata.version("pyfuse3"))' 2>/dev/null || true)
[[ $have == "$LABEL" ]] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The hash is checked by pip before anything of the sdist runs (its metadata step does).
echo "pyfuse3==$VERSION --hash=sha256:$SHA256" > "$work/pin.txt"
if ! "$PY" -m pip download --quiet --no-deps --no-binary pyfuse3 --require-hashes \
        -r "$work/pin.txt" --dest "$work"; then
    echo "build-pyfuse3.sh: could not fetch pyfuse3 $VERSION with SHA-256 $SHA256" >&2
    exit 1
fi
tar -xzf "$work/pyfuse3-$VERSION.tar.gz" -C "$work"
src=$work/pyfuse3-$VERSION
for p in "${PATCHES[@]}"; do
    patch --quiet --batch --forward --directory "$src" -p1 < "$p"
done
# The sdist ships the C file Cython made from the unpatched source: without it, a build
# that cannot run Cython fails instead of quietly compiling the stock reply.
rm "$src/src/pyfuse3/__init__.c"
env "${env[@]}" SETUPTOOLS_SCM_PRETEND_VERSION_FOR_PYFUSE3=$LABEL \
    "$PY" -m pip install --quiet --no-deps "$src"
echo "build-pyfuse3.sh: installed pyfuse3 $LABEL"
