"""A volume's condition (CSI VolumeCondition): abnormal, with casfs's own words, when
its last read/write mount could not save everything, or when its mount has met corrupt
blobs (the daemon counts them in user.casfs.corrupt_reads on the mount root)."""

from __future__ import annotations

import contextlib

from casfs import volumes
from casfs.csi.plugin import Plugin
from casfs.csi.proto import csi_pb2 as pb

CORRUPT_READS = "user.casfs.corrupt_reads"


def condition(plugin: Plugin, info: volumes.VolumeInfo) -> pb.VolumeCondition:
    problems = []
    if info.unsaved:
        problems.append(volumes.describe_unsaved(info.unsaved))
    corrupt = corrupt_reads(plugin.mountpoint(info.name))
    if corrupt:
        problems.append(f"{corrupt} reads met corrupt blobs (see `casfs fsck`)")
    return pb.VolumeCondition(abnormal=bool(problems), message="; ".join(problems) or "healthy")


def corrupt_reads(mountpoint: str | None) -> int:
    if mountpoint is None:
        return 0
    import os

    with contextlib.suppress(OSError, ValueError):
        return int(os.getxattr(mountpoint, CORRUPT_READS))
    return 0
