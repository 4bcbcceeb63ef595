"""What a received snapshot becomes here, decided and written in the catalog: a new
volume, the next snapshot of an existing replica, or nothing (already held), and
where it came from. Refuses (exit 4) when the two stores' lines have diverged.

The rules, for snapshot N of root R offered for local volume V (numbers are the
origin's, so they compare replicas, as the seed design has it):

  * V absent: a new volume whose base and snapshot N are R.
  * V holds N: with root R nothing is to do; with another root the lines diverged.
  * Any number both stores hold must have the same root on both (else: diverged);
    a snapshot removed on either side counts by its bookmark (number and root kept,
    casfs.volumes.prune), so a line stays known after retention.
  * V's newest snapshot L must be older than N; if L was taken here and the source
    never had it, the source went on without it (diverged).
  * V must be at rest, and in the state of L (no change since): then R becomes its
    base and snapshot N, and the next snapshot taken here is N + 1.

`--as NAME` lands the other line as a new volume instead.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from casfs.catalog import meta_value, set_meta, transaction
from casfs.catalog import volumes as rows
from casfs.errors import Busy, Conflict, NotFound, UsageError
from casfs.ids import InodeNo, SnapshotNo
from casfs.kinds import BlobKind, VolumeKind, block_size_refusal
from casfs.lifecycle.phases import VolumePhase
from casfs.refcount import figures, ledger
from casfs.repo import Repository
from casfs.store.ids import BlobId


def store_id(repo: Repository) -> str:
    """This store's id (made at first use): names it as the taker of its snapshots."""
    value = meta_value(repo.conn, "store_id")
    if value is None:
        with transaction(repo.conn) as conn:
            value = meta_value(conn, "store_id")
            if value is None:
                import uuid  # (here: a pull's and a server's start-up need none)

                value = uuid.uuid4().hex
                set_meta(conn, "store_id", value)
    return value


@dataclass(frozen=True)
class Offer:
    """A snapshot another store offers: what a stream's header or a pull's listing says."""

    volume: str  # its name there
    kind: VolumeKind
    mode: str
    chunk_size: int
    n: SnapshotNo
    root: BlobId
    size: int
    next_ino: InodeNo
    label: str | None
    created: float
    made_by: str  # the id of the store that took it

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "root": self.root.hex()}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Offer:
        return Offer(
            str(d["volume"]),
            VolumeKind(d["kind"]),
            str(d["mode"]),
            int(d["chunk_size"]),
            SnapshotNo(int(d["n"])),
            BlobId(bytes.fromhex(d["root"])),
            int(d["size"]),
            InodeNo(int(d["next_ino"])),
            d["label"],
            float(d["created"]),
            str(d["made_by"]),
        )


def offer_of(repo: Repository, volume: str, n: SnapshotNo) -> Offer:
    """Snapshot `volume@n` of this store as an offer (the caller waited for its fold)."""
    conn = repo.conn
    snap = rows.snapshot_row(conn, volume, n)
    row = rows.volume_row(conn, volume)
    if snap is None or row is None:
        raise NotFound(f"no snapshot {volume}@{n}")
    came = rows.provenance(conn, volume).get(n)
    made_by = came.made_by if came is not None else store_id(repo)
    return Offer(
        volume, snap.kind, row.mode, snap.chunk_size, n, snap.root, snap.size, snap.next_ino,
        snap.label, snap.created, made_by,
    )  # fmt: skip


class Plan(StrEnum):
    NEW = "new"  # no such volume here: made
    NEXT = "next"  # an existing replica: the offer is its next snapshot
    HAVE = "have"  # held already, same root: nothing to do


def root_kind(kind: VolumeKind) -> BlobKind:
    return BlobKind.MAP_ROOT if kind == VolumeKind.BLOCK else BlobKind.TREE


@dataclass
class Moved:
    """What a transfer did: for the command's last line and --json."""

    volume: str  # the local name
    n: SnapshotNo
    root: str
    plan: Plan
    blobs: int = 0  # records received (or sent)
    bytes: int = 0  # bytes read (or written) in all
    adopted: int = 0  # blobs adopted through a shared bucket (replica.adopt), not moved
    copied: int = 0  # of the rest, blobs read from that bucket (their pack was going)
    bucket_bytes: int = 0  # bytes read from that bucket (metadata, copied blobs)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "plan": str(self.plan)}


def diverged(name: str, n: int, here: BlobId, there: BlobId) -> Conflict:
    return Conflict(
        f"volume {name} has diverged from the source: snapshot {n} is {here.hex()} here and "
        f"{there.hex()} there (pull with --as NAME to keep the other line as a new volume)"
    )


def check(
    conn: sqlite3.Connection,
    name: str,
    offer: Offer,
    theirs: dict[SnapshotNo, BlobId] | None,  # (with its bookmarks)
    mine_id: str,
    since: SnapshotNo | None = None,
) -> Plan:
    """What landing `offer` as volume `name` means here (the rules above). `theirs`: the
    source's snapshots (None for a stream, which names only its base `since`)."""
    row = rows.volume_row(conn, name)
    if row is None:
        if offer.kind == VolumeKind.BLOCK and offer.mode == "rw":
            too_big = block_size_refusal(offer.size)  # (an older casfs's: writes would fail here)
            if too_big is not None:
                raise UsageError(too_big)
        return Plan.NEW
    if (row.kind, row.chunk_size) != (offer.kind, offer.chunk_size):
        raise Conflict(f"volume {name} exists here as another kind or chunk size: use --as NAME")
    mine = {s.n: s.root for s in rows.snapshot_rows(conn, name)}
    here = mine.get(offer.n)
    if here is not None:
        if here == offer.root:
            return Plan.HAVE
        raise diverged(name, offer.n, here, offer.root)
    both = theirs or {}
    known = {**rows.bookmarks(conn, name), **mine}  # (a snapshot removed here: its bookmark)
    for n in sorted(known.keys() & both.keys()):
        if known[n] != both[n]:
            raise diverged(name, n, known[n], both[n])
    numbers = rows.snapshot_numbers(conn, name)  # (with those taken and still folding)
    if not numbers:
        raise Conflict(f"volume {name} exists here and has no snapshot to continue from: use --as NAME")
    newest = numbers[-1]
    if newest > offer.n:
        raise Conflict(f"volume {name} here has snapshot {newest}, newer than the offered {offer.n}")
    came = rows.provenance(conn, name).get(newest)
    taken_here = came is None or came.made_by == mine_id
    if taken_here and (newest not in theirs if theirs is not None else newest != since):
        raise Conflict(
            f"volume {name} has diverged from the source: snapshot {newest} was taken here and the "
            f"source went on to {offer.n} without it (pull with --as NAME to keep the other line)"
        )
    if row.phase != VolumePhase.READY:
        raise Busy(
            f"volume {name} is {row.phase}" + (f" by process {row.owner_pid}" if row.owner_pid else "")
        )
    if rows.has_overlay(conn, name) or row.base != mine.get(newest):
        raise Conflict(
            f"volume {name} has changes since its snapshot {newest}: snapshot them (and pull with "
            "--as NAME) or roll back first"
        )
    return Plan.NEXT


def land(conn: sqlite3.Connection, name: str, offer: Offer, plan: Plan, source: str) -> None:
    """Write the rows of a received snapshot (inside the caller's transaction, after its
    blobs' rows): the volume made or moved on, snapshot N with N's root, provenance."""
    if plan == Plan.HAVE:
        return
    if plan == Plan.NEW:
        import json  # (here: `volume info` reads replica status through this module)

        spec = json.dumps({"replica": f"{offer.volume}@{offer.n}", "mode": offer.mode}, sort_keys=True)
        rows.insert_volume(
            conn, name, kind=offer.kind, mode=offer.mode, phase=VolumePhase.READY, base=offer.root,
            origin=f"replica:{offer.volume}@{offer.n}", size=offer.size, chunk_size=offer.chunk_size,
            next_ino=offer.next_ino, spec=spec, owner_pid=None, grace_s=None,
        )  # fmt: skip
    else:
        row = rows.volume_row(conn, name)
        assert row is not None
        ledger.release(conn, [row.base])
        rows.set_base(conn, name, offer.root, offer.size, offer.next_ino)
    ledger.retain(conn, [offer.root, offer.root])  # the base's, the snapshot's
    rows.add_snapshot(
        conn, name, offer.root, offer.size, offer.next_ino, offer.label, taken=(offer.n, offer.created)
    )
    rows.set_next_snapshot(conn, name, SnapshotNo(offer.n + 1))
    rows.drop_bookmark(conn, name, offer.n)
    rows.add_provenance(conn, name, rows.Provenance(offer.n, offer.made_by, source, time.time()))
    figures.changed(conn, [f"volume:{name}", f"snapshot:{name}@{offer.n}"])
