"""`active`: the one node that mounts a replicated volume read/write. Taken before the
mount (`casfs mount --volume`, CSI NodeStageVolume), released after its unmount, with
the snapshot the unmount took published in the same transaction. The rule itself is
records.take_active(); this is its round trip through the registry and the catch-up
pull between."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from casfs.errors import Busy
from casfs.replica import records as rec
from casfs.replica.land import Moved
from casfs.replica.registry import Change, Registry, View
from casfs.repo import Repository


def take(
    reg: Registry,
    volume: str,
    node: str,
    store: Callable[[], contextlib.AbstractContextManager[Repository]],
    every: float | None = None,
    remote: str | None = None,
) -> View:
    """`active` for `node` (Busy naming the holder while its lease lives; a takeover
    from a node whose lease expired is recorded), then the newest snapshot pulled into
    `store()` if it is behind. The view decided on: its volume None when VOL is not
    replicated (nothing done), its `active` the holder before. A failed pull releases
    `active` again."""

    def decide(view: View) -> Change | None:
        if view.volume is None:
            return None
        mine = next((n for n in view.nodes if n.name == node), None)
        if mine is None:
            raise Busy(
                f"{view.name} is replicated: this node's agent ({node}) must run to hold it read/write"
            )
        top = rec.newest(view.entries)
        held = view.volume.active
        now = time.time()
        taken = rec.take_active(view.volume, node, mine.lease, view.alive, top.snapshot if top else 0, now)
        if every is not None:
            taken = replace(taken, snapshot_every=every)
        if held is not None and held.node != node:
            return Change(volume=taken, absent_nodes=[held.node])  # (it must still be dead)
        return Change(volume=taken)

    view = reg.change(volume, decide)
    if view.volume is None:
        return view
    source = rec.source_for(node, view.entries, view.alive)
    if source is not None:
        try:
            pull_from(store(), source, volume, remote)
        except BaseException:
            release(reg, volume, node)
            raise
    return view


def pull_from(
    store: contextlib.AbstractContextManager[Repository],
    source: rec.Entry,
    volume: str,
    remote: str | None = None,
    bwlimit: int | None = None,
) -> Moved:
    """`casfs pull` of the newest snapshot of `volume` from the node of `source` (the
    connection started before the store opens, as the CLI's pull does). `bwlimit`:
    at most that many bytes a second read from the source."""
    from casfs.replica.peers import Connection
    from casfs.replica.pull import pull

    with Connection(source.reach, remote, bwlimit) as conn, store as repo:
        return pull(repo, conn, volume)


def release(reg: Registry, volume: str, node: str, here: tuple[int, str | None] | None = None) -> None:
    """`active` released by `node` (if it holds it), and its entry set to `here` (the
    local newest snapshot and root) in the same transaction."""

    def decide(view: View) -> Change | None:
        if view.volume is None:
            return None
        entry = view.entry(node)
        put = (
            []
            if entry is None or here is None
            else [replace(entry, snapshot=here[0], root=here[1], seen=time.time())]
        )
        return Change(volume=rec.release_active(view.volume, node) or view.volume, put=put)

    reg.change(volume, decide)


@contextlib.contextmanager
def opened(repo: Repository) -> Iterator[Repository]:
    """An open store as take()'s `store` (one the caller keeps open)."""
    yield repo
