"""CSI names and ids, and casfs's names for them: one stable scheme, pure functions.

volume id     the casfs volume's name. CreateVolume's name becomes that name when it
              is a valid casfs name (1-128 of letters, digits, '.', '_', '-', starting
              with a letter or digit: Kubernetes' `pvc-<uid>` is), else
              `csi-` + the first 48 hex digits of its SHA-256: the same name always
              gives the same id, so a repeated CreateVolume finds its volume, and a
              volume made with the CLI can be given to Kubernetes by its name.
snapshot id   `VOL@N`, casfs's own reference to snapshot N of volume VOL.
snapshot name kept as the snapshot's label, `csi:` + name: CreateSnapshot finds a
              repeat by it, and `casfs snapshot ls` shows which snapshots CSI made.
"""

from __future__ import annotations

import hashlib

from casfs.errors import CasfsError, UsageError
from casfs.ids import SnapshotNo
from casfs.units import check_name, parse_snapshot_ref

SNAPSHOT_LABEL_PREFIX = "csi:"
CLONE_LABEL_PREFIX = "csi-clone:"  # the snapshot a clone of a volume was made from
MAX_CSI_NAME = 128  # what the spec lets a CO send; kept whole in a label (labels take 200)


def volume_id(name: str) -> str:
    """The id (the casfs name) of the volume CreateVolume `name` makes."""
    check_csi_name(name, "volume")
    try:
        return check_name(name, "volume")
    except UsageError:
        return "csi-" + hashlib.sha256(name.encode()).hexdigest()[:48]


def check_csi_name(name: str, what: str) -> str:
    if not name:
        raise UsageError(f"a {what} name is required")
    if len(name.encode()) > MAX_CSI_NAME or not name.isprintable():
        raise UsageError(f"a {what} name is printable text of at most {MAX_CSI_NAME} bytes")
    return name


def known_volume(volume_id: str) -> str | None:
    """The casfs name an id stands for, or None if it can name no volume (malformed)."""
    try:
        return check_name(volume_id, "volume")
    except CasfsError:
        return None


def snapshot_id(volume: str, n: SnapshotNo) -> str:
    return f"{volume}@{n}"


def known_snapshot(snapshot_id: str) -> tuple[str, SnapshotNo] | None:
    """(volume, n) of an id, or None if it can name no snapshot (malformed)."""
    try:
        return parse_snapshot_ref(snapshot_id)
    except CasfsError:
        return None


def snapshot_label(name: str) -> str:
    return SNAPSHOT_LABEL_PREFIX + check_csi_name(name, "snapshot")
