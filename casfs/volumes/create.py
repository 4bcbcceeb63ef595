"""Creating a volume (a clone of an image or a snapshot, or blank) and deleting one."""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from typing import NamedTuple

from casfs.catalog import images as image_rows
from casfs.catalog import transaction
from casfs.catalog import volumes as rows
from casfs.errors import Busy, Conflict, NotFound, UsageError
from casfs.ids import FIRST_FREE_INO, ROOT_INO, InodeNo
from casfs.kinds import BlobKind, VolumeKind, block_size_refusal, chunk_size_refusal
from casfs.lifecycle import pids
from casfs.lifecycle.faults import fault_point
from casfs.lifecycle.phases import VolumePhase, give_volume, take_volume
from casfs.refcount import figures, ledger
from casfs.repo import Repository
from casfs.store.ids import ZERO_ID, BlobId
from casfs.units import check_name, parse_snapshot_ref
from casfs.volumes.info import Source, VolumeInfo, get_volume, require_at_rest, volume_row


def check_block_size(size: int) -> None:
    why = block_size_refusal(size)
    if why is not None:
        raise UsageError(why)


def blank_tree(chunk_size: int) -> bytes:
    """The root tree of a new blank directory volume: an empty directory of ours."""
    from casfs.snapshots.tree import Attrs, Tree  # (blank volumes only: not a clone's start-up)

    now = time.time_ns()
    attrs = Attrs(
        mode=stat.S_IFDIR | 0o755,
        uid=os.getuid(),
        gid=os.getgid(),
        atime_ns=now,
        mtime_ns=now,
        ctime_ns=now,
        ino=ROOT_INO,
        nlink=2,
    )
    return Tree(attrs, chunk_size).encode()


def create_volume(
    repo: Repository,
    name: str,
    source: Source,
    read_only: bool = False,
    grace_s: float | None = None,
    chunk_size: int | None = None,
) -> tuple[VolumeInfo, bool]:
    """Create a volume; returns (info, created). Repeating an identical create
    succeeds and changes nothing (created False); a different one is a Conflict.
    With `grace_s` the volume is ephemeral: gc removes it once unused that long.
    `chunk_size`: a blank volume's (None: its kind's default); a clone keeps its source's."""
    import json  # (here: of the commands that import this module, only a create needs it)

    check_name(name, "volume")
    if source.snapshot is not None:
        from casfs.volumes.settle import wait_folded  # (here: an image's clone has no use for it)

        wait_folded(repo, *parse_snapshot_ref(source.snapshot))
    chosen = [
        source.image is not None,
        source.snapshot is not None,
        source.blank_dir,
        source.blank_block is not None,
    ]
    if sum(chosen) != 1:
        raise UsageError("give exactly one of --from IMAGE, --from VOL@N, --blank-dir, --blank-block SIZE")
    if grace_s is not None and grace_s <= 0:
        raise UsageError("a grace period must be positive")
    blank = source.blank_dir or source.blank_block is not None
    if chunk_size is not None:
        refusal = chunk_size_refusal(chunk_size) if blank else "a clone keeps its source's chunk size"
        if refusal is not None:
            raise UsageError(refusal)
    mode = "ro" if read_only else "rw"
    # grace_s and chunk_size only when given: the spec of a volume without them stays
    # what format 2 wrote.
    optional = {"grace_s": grace_s, "chunk_size": chunk_size}
    spec = json.dumps(
        {**source.to_json(), "mode": mode, **{k: v for k, v in optional.items() if v is not None}},
        sort_keys=True,
    )
    if blank:
        return _create_blank(repo, name, source, mode, spec, grace_s, chunk_size)
    conn = repo.conn
    # A clone is one transaction: no phase 'creating' is ever visible, nothing to recover.
    with transaction(conn):
        if _existing(conn, name, spec):
            return get_volume(repo, name), False
        if source.image is not None:
            image = image_rows.ready_image_row(conn, source.image)
            assert image.root is not None
            base, kind, chunk_size = image.root, image.kind, image.chunk_size
            size, next_ino = image.size, image.next_ino
            origin = f"image:{source.image}"
        else:
            vol, n = parse_snapshot_ref(source.snapshot or "")
            snap = rows.snapshot_row(conn, vol, n)
            if snap is None:
                raise NotFound(f"no snapshot {vol}@{n}")
            if snap.phase == VolumePhase.DELETING:
                raise Busy(f"volume {vol!r} is being deleted")
            base, kind, chunk_size = snap.root, snap.kind, snap.chunk_size
            size, next_ino = snap.size, snap.next_ino
            origin = f"snapshot:{vol}@{n}"
        source_subject = origin if source.image is not None else f"snapshot:{vol}@{n}"
        made = Made(base, kind, chunk_size, size, next_ino, origin, source_subject)
        _insert_clone(conn, name, made, mode, spec, grace_s)
    fault_point("create:after-commit")
    return get_volume(repo, name), True


class Made(NamedTuple):
    """What a clone is made of: its base tree and what it inherits from its source."""

    base: BlobId
    kind: VolumeKind
    chunk_size: int
    size: int
    next_ino: InodeNo
    origin: str  # the volume's origin ('image:NAME', 'snapshot:VOL@N', 'chain:ID')
    subject: str  # the kept figures' subject the base comes from


def _insert_clone(
    conn: sqlite3.Connection, name: str, m: Made, mode: str, spec: str, grace_s: float | None
) -> None:
    """Inside the caller's transaction: the volume's row, one reference on its base."""
    if m.kind == VolumeKind.BLOCK and mode == "rw":
        check_block_size(m.size)  # (a read-only clone keeps no upper file: any size reads)
    ledger.retain(conn, [m.base])
    rows.insert_volume(
        conn,
        name,
        kind=m.kind,
        mode=mode,
        phase=VolumePhase.READY,
        base=m.base,
        origin=m.origin,
        size=m.size,
        chunk_size=m.chunk_size,
        next_ino=m.next_ino,
        spec=spec,
        owner_pid=None,
        grace_s=grace_s,
    )
    figures.cloned(conn, name, m.base, m.subject)


def clone_chain(repo: Repository, name: str, chain_id: str, read_only: bool = False) -> VolumeInfo:
    """A volume of the tree an OCI image keeps for the layers `chain_id` names (all its
    layers, or its first ones), O(1) as any clone; origin 'chain:ID'. NotFound if no
    ready image keeps it."""
    import json

    from casfs.refcount.logical import root_size  # (here: only this clone sizes its tree)

    check_name(name, "volume")
    mode = "ro" if read_only else "rw"
    conn = repo.conn
    with transaction(conn):
        held = image_rows.chain_holder(conn, chain_id)
        if held is None:
            raise NotFound(f"no image holds the layers of chain {chain_id}")
        image, base = held
        # Inode numbers grow layer by layer: the image's next one is past any tree of its first layers.
        size = image.size if base == image.root else root_size(repo.get_meta, image.kind, base)
        made = Made(
            base,
            image.kind,
            image.chunk_size,
            size,
            image.next_ino,
            f"chain:{chain_id}",
            f"image:{image.name}",
        )
        spec = json.dumps({"chain": chain_id, "mode": mode}, sort_keys=True)
        if _existing(conn, name, spec):
            return get_volume(repo, name)
        _insert_clone(conn, name, made, mode, spec, None)
    return get_volume(repo, name)


def _existing(conn: sqlite3.Connection, name: str, spec: str) -> bool:
    """Inside the caller's transaction: True if `name` exists with this spec (a repeat);
    Conflict if with another; Busy while a live process creates or deletes it."""
    row = rows.volume_row(conn, name)
    if row is None:
        return False
    pid = row.owner_pid
    if row.phase in (VolumePhase.CREATING, VolumePhase.DELETING):
        verb = "created" if row.phase == VolumePhase.CREATING else "deleted"
        if pids.alive(pid):
            raise Busy(f"volume {name!r} is being {verb} by process {pid}")
        raise Busy(f"volume {name!r} was being {verb} by process {pid}, which died: rerun to recover it")
    if row.spec != spec:
        raise Conflict(f"volume {name!r} already exists with a different spec")
    return True


def _create_blank(
    repo: Repository,
    name: str,
    source: Source,
    mode: str,
    spec: str,
    grace_s: float | None,
    chunk_size: int | None,
) -> tuple[VolumeInfo, bool]:
    """Record the volume (phase creating) before writing its base, then publish both."""
    kind, size = (VolumeKind.DIR, 0) if source.blank_dir else (VolumeKind.BLOCK, int(source.blank_block or 0))
    chunk_size = chunk_size or kind.default_chunk_size
    conn = repo.conn
    with transaction(conn):
        if _existing(conn, name, spec):
            return get_volume(repo, name), False  # (even one made before the size limit)
        check_block_size(size)
        # ZERO_ID: a base that holds no reference until the real one is committed.
        rows.insert_volume(
            conn,
            name,
            kind=kind,
            mode=mode,
            phase=VolumePhase.CREATING,
            base=ZERO_ID,
            origin="blank",
            size=size,
            chunk_size=chunk_size,
            next_ino=FIRST_FREE_INO,
            spec=spec,
            owner_pid=os.getpid(),
            grace_s=grace_s,
        )
    try:
        fault_point("create:after-claim")
        with repo.batch() as batch:
            if source.blank_dir:
                base = batch.put(blank_tree(chunk_size), BlobKind.TREE)
            else:
                from casfs.snapshots import chunkmap

                base = chunkmap.blank_map(batch.put_kind, size, chunk_size)

            def finish(c: sqlite3.Connection) -> None:
                rows.set_base(c, name, base)
                give_volume(c, name, VolumePhase.CREATING, os.getpid())
                figures.new_subject(c, f"volume:{name}")
                if batch.shared:  # (a blank base of that size was stored already: now shared)
                    figures.shared_unknown(c)

            batch.commit({base: 1}, then=finish)
    except BaseException:
        with transaction(conn):
            rows.delete_in_phase(conn, name, VolumePhase.CREATING, os.getpid())
        raise
    from casfs.refcount.accounts import settle  # (a blank base is a few blobs: counted at once)

    settle(repo, [f"volume:{name}"])
    return get_volume(repo, name), True


def remove_volume(repo: Repository, name: str, if_exists: bool = False) -> bool:
    """Delete a volume and its snapshots, in two steps: phase deleting is recorded
    (the checks pass or nothing changes), then one transaction releases and deletes.
    A process that dies in between leaves the delete for recovery to finish."""
    conn = repo.conn
    with transaction(conn):
        row = rows.volume_row(conn, name)
        if row is None:
            if if_exists:
                return False
            raise NotFound(f"no volume named {name!r}")
        if row.phase == VolumePhase.DELETING and pids.alive(row.owner_pid):
            raise Busy(f"volume {name!r} is being deleted by process {row.owner_pid}")
        if row.phase != VolumePhase.DELETING:
            mark_deleting(conn, name)
        else:  # its deleter died: take the delete over
            take_volume(conn, name, VolumePhase.DELETING, VolumePhase.DELETING)
    fault_point("delete:after-phase")
    finish_delete(repo, name)
    return True


def mark_deleting(conn: sqlite3.Connection, name: str) -> None:
    """Step 1 of a delete, inside the caller's transaction: refuse (Busy) unless the
    volume is at rest and nothing was made from its snapshots, then record phase deleting."""
    require_at_rest(volume_row(conn, name))
    users = rows.made_from_snapshots_of(conn, name)
    if users:
        raise Busy(f"volume {name!r} has snapshots that volume(s) {', '.join(users)} were made from")
    take_volume(conn, name, VolumePhase.READY, VolumePhase.DELETING)


def finish_delete(repo: Repository, name: str) -> bool:
    """Step 2: release every root the volume holds and delete its rows, in one
    transaction. Idempotent: False if the volume is gone (or not being deleted)."""
    conn = repo.conn
    with transaction(conn):
        row = rows.volume_row(conn, name)
        if row is None or row.phase != VolumePhase.DELETING:
            return False
        held = rows.held_roots(conn, name)
        ledger.release(conn, held)
        rows.delete_volume(conn, name)
        figures.volume_removed(conn, name, held)
    from casfs.store import uppers  # (here: shutil and pathlib are not a clone's)

    uppers.remove_all(repo.path, name)  # (left-overs of a crash here: gc removes them)
    return True
