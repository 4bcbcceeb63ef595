"""Opening a mounted read/write volume: the core (casfs.vfs.rw.volume.RwVolume) with
the kind of the volume's row (casfs.vfs.rw.dirkind.DirKind or
casfs.vfs.rw.blockkind.BlockKind).
"""

from __future__ import annotations

from collections.abc import Callable

from casfs.catalog.volumes import volume_row
from casfs.errors import NotFound
from casfs.kinds import VolumeKind
from casfs.repo import Repository
from casfs.vfs.api import NeedChunks
from casfs.vfs.rw.blockkind import BlockKind
from casfs.vfs.rw.dirkind import DirKind
from casfs.vfs.rw.volume import RwVolume

Volume = RwVolume

__all__ = ["BlockKind", "DirKind", "NeedChunks", "RwVolume", "Volume", "open_volume"]


def open_volume(
    repo: Repository, name: str, claim: Callable[[tuple[object, ...]], None] | None = None
) -> RwVolume:
    """The read/write view of volume `name` (see RwVolume.__init__ for `claim`)."""
    row = volume_row(repo.conn, name)
    if row is None:
        raise NotFound(f"no volume named {name!r}")
    kind = BlockKind if row.kind == VolumeKind.BLOCK else DirKind
    return RwVolume(repo, name, kind, claim)
