"""An OCI runtime bundle's config.json (runtime-spec config.md) for a rootfs made from an
OCI image: the image's entrypoint + cmd, env, working dir and user, in the shape
`runc spec` writes, with Docker's default capabilities (so root in the container may
chown, bind low ports, ... as images expect) and no terminal (stdio is the caller's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from casfs.errors import UsageError

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Docker's (and containerd's) default set: moby's oci/caps/defaults.go.
CAPABILITIES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]
NOEXEC = ["nosuid", "noexec", "nodev"]
MOUNTS: list[dict[str, Any]] = [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {
        "destination": "/dev",
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
    },
    {
        "destination": "/dev/pts",
        "type": "devpts",
        "source": "devpts",
        "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
    },
    {
        "destination": "/dev/shm",
        "type": "tmpfs",
        "source": "shm",
        "options": [*NOEXEC, "mode=1777", "size=65536k"],
    },
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": NOEXEC},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": [*NOEXEC, "ro"]},
    {
        "destination": "/sys/fs/cgroup",
        "type": "cgroup",
        "source": "cgroup",
        "options": [*NOEXEC, "relatime", "ro"],
    },
]
MASKED = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
]
READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


def runtime_config(
    oci: dict[str, Any], rootfs: Path, hostname: str, readonly: bool = False
) -> dict[str, Any]:
    args = [*oci["entrypoint"], *oci["cmd"]]
    if not args:
        raise UsageError("the image names no entrypoint or cmd: nothing to run")
    uid, gid, home = resolve_user(oci["user"], rootfs)
    env = list(oci["env"])
    if not any(e.startswith("PATH=") for e in env):
        env.insert(0, DEFAULT_PATH)
    if home and not any(e.startswith("HOME=") for e in env):
        env.append(f"HOME={home}")
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": args,
            "env": env,
            "cwd": oci["workdir"] or "/",
            "capabilities": {k: CAPABILITIES for k in ("bounding", "effective", "permitted")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs), "readonly": readonly},
        "hostname": hostname,
        "mounts": MOUNTS,
        "annotations": {k: v for k, v in oci["labels"].items()},
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "maskedPaths": MASKED,
            "readonlyPaths": READONLY,
        },
    }


def resolve_user(user: str, rootfs: Path) -> tuple[int, int, str]:
    """(uid, gid, home) of an image's User (`user`, `uid`, `user:group`, `uid:gid`; names
    looked up in the rootfs's /etc/passwd and /etc/group, as runc's libcontainer does)."""
    name, _, group = (user or "0").partition(":")
    passwd = _table(rootfs / "etc" / "passwd")
    entry = next((e for e in passwd if e[0] == name or (name.isdigit() and e[2] == name)), None)
    if name.isdigit():
        uid = int(name)
    elif entry is not None and entry[2].isdigit():
        uid = int(entry[2])
    else:
        raise UsageError(f"the image's user {name!r} is not in its /etc/passwd")
    gid = int(entry[3]) if entry is not None and entry[3].isdigit() else 0
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            found = next((e for e in _table(rootfs / "etc" / "group") if e[0] == group), None)
            if found is None or not found[2].isdigit():
                raise UsageError(f"the image's group {group!r} is not in its /etc/group")
            gid = int(found[2])
    home = entry[5] if entry is not None and len(entry) > 5 else "/"
    return uid, gid, home


def _table(path: Path) -> list[list[str]]:
    try:
        text = path.read_text(errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]
