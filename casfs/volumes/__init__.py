"""Volumes and their snapshots, at rest: create, list, delete, snapshot, rollback.

A volume is a base root plus (while mounted read/write) an overlay. Creating one from
an image or a snapshot adds one reference to that root: O(1) whatever its size. The
mount daemon (casfs.fuse) folds the overlay into a new base; everything here works on
volumes that are not mounted read/write.

Phases (casfs.lifecycle.phases; recorded before the work, with the owner's pid;
casfs.upkeep.recovery handles those a dead process left):

  creating       a blank volume's base is being written (a clone is one transaction)
  ready          at rest
  mounted        held read/write by a daemon (casfs.lifecycle.claims.claim_volume)
  snapshotting   a crashed mount's overlay is being folded (settle): on a crash the
                 overlay is intact (the fold is one transaction) and the next snapshot
                 redoes it
  deleting       recorded first; the deletion transaction follows, and recovery
                 finishes it if the process died in between

    info.py       VolumeInfo, SnapshotInfo, Source; get and list; the at-rest checks
    create.py     create (clone, blank) and delete
    settle.py     fold what a crashed mount left (the read/write view, imported lazily)
    snapshots.py  snapshot create, list, delete; snapshot_at_rest for a held volume
    rollback.py   rollback and resize
    prune.py      retention: which snapshots a policy keeps; removing the rest (bookmarked)
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from casfs.volumes.create import (
        clone_chain,
        create_volume,
        finish_delete,
        mark_deleting,
        remove_volume,
    )
    from casfs.volumes.info import (
        SnapshotInfo,
        Source,
        VolumeInfo,
        describe_unsaved,
        get_volume,
        list_volumes,
    )
    from casfs.volumes.rollback import resize, rollback
    from casfs.volumes.settle import has_overlay
    from casfs.volumes.snapshots import (
        create_snapshot,
        list_snapshots,
        record_snapshot,
        remove_snapshot,
        snapshot_at_rest,
    )

# Each name's module, imported at the name's first use (PEP 562): a clone of an image
# needs create and info only, and the others, with the overlay rows they import, were a
# twentieth of its start-up.
_MODULES = {
    "create": (
        "clone_chain",
        "create_volume",
        "finish_delete",
        "mark_deleting",
        "remove_volume",
    ),
    "info": ("SnapshotInfo", "Source", "VolumeInfo", "describe_unsaved", "get_volume", "list_volumes"),
    "rollback": ("resize", "rollback"),
    # (Not `settle` itself: once casfs.volumes.settle is imported, the package's attribute
    # of that name is the module, whatever this table says; import it from the module.)
    "settle": ("has_overlay",),
    "snapshots": (
        "create_snapshot",
        "list_snapshots",
        "record_snapshot",
        "remove_snapshot",
        "snapshot_at_rest",
    ),
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "SnapshotInfo",
    "Source",
    "VolumeInfo",
    "clone_chain",
    "create_snapshot",
    "create_volume",
    "describe_unsaved",
    "finish_delete",
    "get_volume",
    "has_overlay",
    "list_snapshots",
    "list_volumes",
    "mark_deleting",
    "record_snapshot",
    "remove_snapshot",
    "remove_volume",
    "resize",
    "rollback",
    "snapshot_at_rest",
]
