"""What is mounted where, from /proc/self/mountinfo: never by stat'ing a mount point,
which blocks for ever when its daemon hangs. (tests/ and benchmarks/ use it too.)

A line reads `ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE
SOURCE SUPER_OPTIONS`; see proc(5).
"""

from __future__ import annotations

from dataclasses import dataclass

FSTYPE = "fuse.casfs"  # what the kernel shows for a casfs mount (subtype=casfs)


@dataclass(frozen=True)
class MountEntry:
    mount_id: int
    device: str  # major:minor; for FUSE the minor names /sys/fs/fuse/connections/<minor>
    mountpoint: str
    fstype: str
    source: str
    root: str = "/"  # the mounted path inside its filesystem (a bind of /dev/loop3: "/loop3")
    options: str = ""  # the mount's own options: "ro,nosuid,…" or "rw,…"

    @property
    def read_only(self) -> bool:
        return "ro" in self.options.split(",")

    @property
    def minor(self) -> int:
        return int(self.device.partition(":")[2])

    @property
    def is_casfs(self) -> bool:
        return self.fstype == FSTYPE


def unescape(text: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def mounts() -> list[MountEntry]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            rest = right.split()
            if len(fields) < 6 or len(rest) < 2:
                continue
            point, source = unescape(fields[4]), unescape(rest[1])
            entry = MountEntry(
                int(fields[0]), fields[2], point, rest[0], source, unescape(fields[3]), fields[5]
            )
            out.append(entry)
    return out


def find_mount(mountpoint: str) -> MountEntry | None:
    """The topmost mount at exactly this path."""
    found = None
    for entry in mounts():
        if entry.mountpoint == mountpoint:
            found = entry
    return found
