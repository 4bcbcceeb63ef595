#!/usr/bin/env bash
# The C peers the benchmarks run casfs beside (not needed by the tests): qemu-storage-daemon
# (qemu-system-common) for block volumes, squashfuse/squashfs-tools, borg and restic for
# images and imports. Idempotent, like install.sh, which it runs first.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
PACKAGES=(qemu-system-common qemu-utils squashfuse squashfs-tools borgbackup restic fio bindfs b3sum rsync btrfs-progs)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if ((${#missing[@]})); then
    sudo=()
    [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    "${sudo[@]}" ./scripts/apt-wait.sh update
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive ./scripts/apt-wait.sh install -y "${missing[@]}"
fi
echo "install-bench.sh: ready"
