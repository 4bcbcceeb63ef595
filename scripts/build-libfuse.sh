#!/usr/bin/env bash
# libfuse >= 3.17 (FUSE passthrough: the kernel reads and writes an open file's backing
# file itself, the daemon off the data path), for pyfuse3 to build against. Prints the
# pkg-config directory to build with, or nothing when pyfuse3 should use the system's:
#
#   - the system's libfuse3 is new enough (Debian 13, a current Ubuntu): nothing to build;
#   - otherwise (Debian 12 ships 3.14) Debian's own source package `fuse3` from unstable,
#     fetched by `apt-get source` through a private apt configuration (the system's sources
#     are not touched) whose one deb-src entry is signed by the Debian archive keyring: apt
#     checks the Release signature and every file's checksum. Built with meson into
#     PREFIX (default .venv/libfuse), library only. Idempotent: an existing build is kept.
#
# Any failure (no network, an unstable without 3.17+, a failed build) prints a warning
# and nothing on stdout: casfs then runs on the system's libfuse without passthrough,
# as before, and its log says why passthrough is off.
set -uo pipefail
cd "$(dirname "$0")/.."
PREFIX=${1:-$PWD/.venv/libfuse}
MIN=3.17
warn() { echo "build-libfuse.sh: $*; pyfuse3 builds against the system's libfuse (no passthrough)" >&2; }

if pkg-config --atleast-version=$MIN fuse3 2>/dev/null; then
    exit 0  # the system's is new enough
fi
pcdir=$(find "$PREFIX" -name fuse3.pc -path '*/pkgconfig/*' -printf '%h\n' 2>/dev/null | head -n 1)
if [[ -n $pcdir ]] && PKG_CONFIG_PATH=$pcdir pkg-config --atleast-version=$MIN fuse3; then
    echo "$pcdir"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
cat > "$work/unstable.sources" <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: unstable
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt=(-o "Dir::Etc::SourceList=$work/unstable.sources" -o Dir::Etc::SourceParts=/dev/null
     -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o APT::Sandbox::User=root)
if ! apt-get "${apt[@]}" -qq update >"$work/log" 2>&1; then
    warn "apt-get update of Debian unstable's sources failed ($(tail -n 1 "$work/log"))"
    exit 0
fi
if ! (cd "$work" && apt-get "${apt[@]}" -qq source fuse3 >"$work/log" 2>&1); then
    warn "apt-get source fuse3 failed ($(tail -n 1 "$work/log"))"
    exit 0
fi
src=$(find "$work" -maxdepth 1 -type d -name 'fuse3-*' | head -n 1)
version=${src##*/fuse3-}
if [[ -z $src ]] || ! dpkg --compare-versions "$version" ge $MIN; then
    warn "Debian unstable has fuse3 '${version:-?}', older than $MIN"
    exit 0
fi
if ! meson setup "$work/build" "$src" --prefix="$PREFIX" --libdir=lib --buildtype=release \
        -Dexamples=false -Dutils=false -Dtests=false >"$work/log" 2>&1 \
    || ! ninja -C "$work/build" install >>"$work/log" 2>&1; then
    warn "building libfuse $version failed ($(tail -n 1 "$work/log"))"
    exit 0
fi
echo "build-libfuse.sh: built libfuse $version into $PREFIX" >&2
echo "$PREFIX/lib/pkgconfig"
