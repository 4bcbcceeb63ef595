"""A directory volume's namespace, for tests that drive one without a mount."""

from __future__ import annotations

from casfs.vfs.rw.blockkind import BlockKind
from casfs.vfs.rw.jobs.freeze import Freeze
from casfs.vfs.rw.names import DirNames
from casfs.vfs.rw.volume import RwVolume


def names(v: RwVolume) -> DirNames:
    """The namespace of a directory volume (a test's volume of that kind)."""
    assert v.names is not None, f"volume {v.name} has no names (a block volume)"
    return v.names


def block(v: RwVolume) -> BlockKind:
    """The block kind of a block volume (a test's volume of that kind)."""
    assert isinstance(v.kind, BlockKind), f"volume {v.name} is not a block volume"
    return v.kind


def freeze_of(v: RwVolume, label: str | None) -> Freeze | None:
    """The O(1) snapshot of a block volume, where it can freeze now (None: it would fold)."""
    return Freeze.capture(block(v), label)
