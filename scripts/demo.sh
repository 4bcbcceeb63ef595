#!/usr/bin/env bash
# casfs's main job on a small built-in example, in a throwaway store (nothing downloaded):
# import a directory tree and a raw ext4 disk image, clone volumes from both, snapshot,
# list; then, when the FUSE daemon is there, mount the store, list it and unmount.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-$PWD/.venv}
[[ -x $venv/bin/casfs ]] || { echo "demo.sh: run ./scripts/install.sh first" >&2; exit 1; }
PATH=$venv/bin:$PATH

work=$(mktemp -d "${TMPDIR:-/var/tmp}/casfs-demo.XXXXXX")
mnt=$work/mnt
cleanup() {
    if mountpoint -q "$mnt" 2>/dev/null; then
        casfs umount "$mnt" || fusermount3 -u -z "$mnt" || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
export CASFS_STORE=$work/store
run() { echo "\$ casfs $*"; casfs "$@"; }

# An example tree: text, an executable, a symlink, a hardlink, a sparse file, an xattr.
tree=$work/tree
mkdir -p "$tree/etc" "$tree/usr/bin" "$tree/var/log"
echo demo > "$tree/etc/hostname"
ln "$tree/etc/hostname" "$tree/etc/hostname.bak"
seq 1 50000 > "$tree/var/log/numbers.log"
printf '#!/bin/sh\necho hello from casfs\n' > "$tree/usr/bin/hello"
chmod 755 "$tree/usr/bin/hello"
ln -s ../usr/bin/hello "$tree/etc/hello"
truncate -s 8M "$tree/var/sparse.img"
setfattr -n user.casfs.demo -v yes "$tree/etc/hostname" 2>/dev/null || true

# A raw disk image: a 64 MiB ext4 filesystem made from the same tree (no mount needed).
disk=$work/disk.img
truncate -s 64M "$disk"
mkfs.ext4 -q -F -d "$tree" "$disk"

run init
run image import demo-tree "$tree"
run image import demo-disk "$disk"
run volume create app --from demo-tree
run volume create vm --from demo-disk
run snapshot create vm --label first-boot
run volume create vm-clone --from vm@1
run volume create scratch --blank-block 1G
run image ls
run volume ls
run fsck

if python -c 'import casfs.fuse.daemon' 2>/dev/null; then
    mkdir "$mnt"
    run mount "$mnt"
    for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
    ls -lR "$mnt"
    run umount "$mnt"
else
    echo "demo.sh: casfs.fuse is not in this tree yet: skipping the mount part"
fi
echo "demo.sh: done"
