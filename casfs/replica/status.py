"""A volume's replica bookkeeping, for `casfs volume info`, and the live check behind
`casfs volume rm VOL --if-replicated K`: never delete the last good copy."""

from __future__ import annotations

from typing import Any

from casfs.catalog import transaction
from casfs.catalog import volumes as rows
from casfs.errors import CasfsError, Conflict
from casfs.replica.land import store_id
from casfs.repo import Repository


def replica_doc(repo: Repository, name: str) -> dict[str, Any]:
    """The newest local snapshot, where each snapshot came from (taken here, or received:
    from which SOURCE, taken by which store), and each known peer as last seen."""
    conn = repo.conn
    numbers = rows.snapshot_numbers(conn, name)
    came = rows.provenance(conn, name)
    here = store_id(repo)
    sources = {
        str(n): {"taken_by": here, "source": None, "received": None}
        if n not in came
        else {"taken_by": came[n].made_by, "source": came[n].source, "received": came[n].received}
        for n in numbers
    }
    peers = [
        {**p._asdict(), "root": None if p.root is None else p.root.hex()} for p in rows.peers(conn, name)
    ]
    return {
        "store_id": here,
        "newest_snapshot": numbers[-1] if numbers else None,
        "snapshot_sources": sources,
        "peers": peers,
    }


def check_replicated(repo: Repository, name: str, k: int, remote: str | None = None) -> list[str]:
    """The SOURCEs of at least `k` known peers that hold, asked now, a snapshot of the
    volume at least as new as the local newest (the same root where they hold that
    number); Conflict (exit 4) naming what each other peer lacks if fewer do."""
    from casfs.replica.peers import Connection  # (here: `volume info` needs none of the protocol)
    from casfs.replica.pull import listing, peer_row

    conn = repo.conn
    numbers = rows.snapshot_numbers(conn, name)
    if not numbers:
        raise Conflict(f"volume {name} has no snapshot: no peer can hold a copy of it")
    newest = numbers[-1]
    mine = rows.snapshot_row(conn, name, newest)
    good: list[str] = []
    why: list[str] = []
    for peer in rows.peers(conn, name):
        try:
            with Connection(peer.source, remote) as c:
                hello, snaps = listing(c, peer.remote)
        except CasfsError as e:
            why.append(f"{peer.source}: {e}")
            continue
        with transaction(conn):
            rows.record_peer(conn, name, peer_row(peer.source, str(hello["store"]), peer.remote, snaps))
        same = snaps.get(newest)
        if same is not None and mine is not None and same != mine.root:
            why.append(f"{peer.source}: its {peer.remote}@{newest} is another snapshot ({same.hex()})")
        elif max(snaps, default=0) >= newest:
            good.append(peer.source)
        else:
            why.append(f"{peer.source}: newest {peer.remote}@{max(snaps, default=0)}")
    if len(good) < k:
        known = "; ".join(why) or "no peer is known (peers are recorded by `casfs pull`)"
        raise Conflict(f"only {len(good)} of the {k} peers asked hold {name}@{newest} or newer: {known}")
    return good
