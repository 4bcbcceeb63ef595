"""Which CSI volume capabilities casfs serves, and why it refuses the others.

A casfs volume lives in one node's store: every access mode is a single-node one. A
directory volume is served as a mount (a FUSE mount of casfs: no filesystem type to
choose), a block volume as a raw device (a loop device over the volume's file).
"""

from __future__ import annotations

from collections.abc import Iterable

from casfs.csi.proto import csi_pb2 as pb
from casfs.errors import UsageError
from casfs.kinds import VolumeKind

Mode = pb.VolumeCapability.AccessMode
SINGLE_NODE = (
    Mode.SINGLE_NODE_WRITER,
    Mode.SINGLE_NODE_READER_ONLY,
    Mode.SINGLE_NODE_SINGLE_WRITER,
    Mode.SINGLE_NODE_MULTI_WRITER,
)
READ_ONLY_MODES = (Mode.SINGLE_NODE_READER_ONLY, Mode.MULTI_NODE_READER_ONLY)
FS_TYPES = ("", "casfs", "fuse.casfs")
# What a bind mount of the staged volume can honour, remounted with them.
MOUNT_FLAGS = frozenset(
    {"ro", "rw", "nosuid", "suid", "nodev", "dev", "noexec", "exec", "noatime", "relatime", "nodiratime"}
)


def kind_asked(capabilities: Iterable[pb.VolumeCapability]) -> VolumeKind | None:
    """The kind the capabilities need: block for raw block access, dir for a mount;
    None if they do not say (no capability names an access type)."""
    kinds = {_kind(c) for c in capabilities} - {None}
    if len(kinds) > 1:
        raise UsageError("one volume cannot be asked both as a raw block device and as a mount")
    return kinds.pop() if kinds else None


def _kind(c: pb.VolumeCapability) -> VolumeKind | None:
    which = c.WhichOneof("access_type")
    return VolumeKind.BLOCK if which == "block" else VolumeKind.DIR if which == "mount" else None


def refusal(c: pb.VolumeCapability, kind: VolumeKind) -> str | None:
    """Why a volume of `kind` cannot be used with capability `c`, or None if it can."""
    which = c.WhichOneof("access_type")
    if which is None:
        return "a volume capability names its access type (block or mount)"
    if not c.HasField("access_mode") or c.access_mode.mode == Mode.UNKNOWN:
        return "a volume capability names its access mode"
    if c.access_mode.mode not in SINGLE_NODE:
        return (
            f"access mode {Mode.Mode.Name(c.access_mode.mode)} is not served: a casfs volume "
            "lives on one node"
        )
    if which == "block" and kind != VolumeKind.BLOCK:
        return "a directory volume cannot be used as a raw block device"
    if which == "mount" and kind != VolumeKind.DIR:
        return "a block volume is served as a raw block device (volumeMode: Block), not mounted"
    if which == "mount":
        if c.mount.fs_type not in FS_TYPES:
            return f"filesystem type {c.mount.fs_type!r} is not served: a directory volume is a casfs mount"
        unknown = [f for f in c.mount.mount_flags if f not in MOUNT_FLAGS]
        if unknown:
            return f"mount flag {unknown[0]!r} is not supported (supported: {', '.join(sorted(MOUNT_FLAGS))})"
    return None


def check(capabilities: Iterable[pb.VolumeCapability], kind: VolumeKind) -> None:
    for c in capabilities:
        why = refusal(c, kind)
        if why is not None:
            raise UsageError(why)


def require(capabilities: Iterable[pb.VolumeCapability]) -> list[pb.VolumeCapability]:
    given = list(capabilities)
    if not given:
        raise UsageError("volume capabilities are required")
    return given


def read_only_mode(c: pb.VolumeCapability) -> bool:
    return c.access_mode.mode in READ_ONLY_MODES
