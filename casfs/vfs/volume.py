"""Opening a mounted read/write volume as the class of its kind:
casfs.vfs.dirvolume.DirVolume or casfs.vfs.blockvolume.BlockVolume.
"""

from __future__ import annotations

from collections.abc import Callable

from casfs.catalog.volumes import volume_row
from casfs.errors import CasfsError
from casfs.kinds import VolumeKind
from casfs.repo import Repository
from casfs.vfs.api import NeedChunks
from casfs.vfs.blockvolume import BlockVolume
from casfs.vfs.dirvolume import DirVolume
from casfs.vfs.overlay.writeback import RwVolume

Volume = DirVolume | BlockVolume

__all__ = ["BlockVolume", "DirVolume", "NeedChunks", "RwVolume", "Volume", "open_volume"]


def open_volume(
    repo: Repository, name: str, claim: Callable[[tuple[object, ...]], None] | None = None
) -> Volume:
    """The read/write view of volume `name` (see RwVolume.__init__ for `claim`)."""
    row = volume_row(repo.conn, name)
    if row is None:
        raise CasfsError(f"no volume named {name!r}")
    if row.kind == VolumeKind.BLOCK:
        return BlockVolume(repo, name, claim)
    return DirVolume(repo, name, claim)
