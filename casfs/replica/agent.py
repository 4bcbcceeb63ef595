"""`casfs replica agent --node N --store S --reach URL`: one per node, a reconcile loop
over the registry (Kubernetes controllers' model): read everything at one revision,
decide with casfs.replica.records, write through compare-and-swap, act on the local
store, again. Its state is in the registry and the store, never only in memory: killed
at any point, a restart resumes (a pull is resumable; an entry is republished).

Each round, for every replicated volume:
  - an entry of this node marked leaving: the local copy is deleted (unless mounted),
    then the entry;
  - a local copy: its entry is published when the registry's differs (the snapshot an
    unmount or `--snapshot-every` took reaches the others this way too), unless another
    node published that snapshot number first with other content: then the local line
    is kept as below, never published as a replica of VOL; `active` held by this node
    on a volume no longer mounted here is released;
  - a newer snapshot elsewhere (and no read/write mount here): pulled from that node;
    a line that diverged from it is kept as VOL.diverged-NODE-N, then VOL follows;
  - fewer replicas than the factor, and records.creator() names this node: it writes
    its entry (snapshot 0) and pulls at the next round.
The node's key lives on a lease refreshed by a thread of its own (a long pull does not
starve it). etcd down: the round fails as a whole, is logged, and is tried again; no
decision is made without a fresh read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from casfs.catalog import volumes as rows
from casfs.errors import Busy, CasfsError, Conflict
from casfs.ids import SnapshotNo
from casfs.lifecycle import pids
from casfs.replica import records as rec
from casfs.replica.registry import Change, Registry, RegistryDown, View
from casfs.repo import Repository
from casfs.volumes.prune import KeepPolicy, prune

log = logging.getLogger("casfs.replica.agent")

TTL_S = int(os.environ.get("CASFS_REPLICA_TTL", "10"))  # the node's lease (tests: etcd's minimum)
POLL_S = float(os.environ.get("CASFS_REPLICA_POLL", "0.2"))  # between rounds when nothing changed
# `active` held here on a volume not mounted here for this long is released (a mount
# takes `active` a moment before its daemon claims the volume; a crashed one never
# unmounts): longer than any mount's start.
GRACE_S = float(os.environ.get("CASFS_REPLICA_GRACE", "30"))


def local(repo: Repository, volume: str) -> tuple[int, str | None, bool] | None:
    """(newest snapshot, its root hex, mounted by a live process) of the local copy; None
    when this store has no such volume."""
    row = rows.volume_row(repo.conn, volume)
    if row is None:
        return None
    roots = rows.snapshot_roots(repo.conn, volume)
    n = max(roots, default=0)
    return n, (roots[SnapshotNo(n)].hex() if n else None), pids.alive(row.owner_pid)


def mountpoint(repo: Repository, volume: str) -> str | None:
    """Where `volume` is mounted from this store, from the daemons' run files (the
    launcher's records: STORE/run/*.json)."""
    for path in sorted(Path(repo.dir, "run").glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(path.read_text())
            if doc.get("volume") == volume and doc.get("state") == "mounted" and pids.alive(doc.get("pid")):
                return str(doc["mountpoint"])
    return None


class Agent:
    def __init__(
        self,
        registry: Registry,
        node: str,
        store: str,
        reach: str,
        remote: str | None = None,
        bwlimit: int | None = None,
        recover: Callable[[Repository], object] | None = None,
    ) -> None:
        """`recover`: settles what dead processes left half done in the store (the CLI's
        recovery, from a floor above), run before each change to a local copy."""
        self.registry, self.node, self.store, self.reach = registry, node, store, reach
        self.remote, self.bwlimit, self.recover = remote, bwlimit, recover
        self.lease = 0
        self._periodic: dict[str, float] = {}  # volume -> when this agent last snapshotted its mount
        self._kept: dict[str, int] = {}  # volume -> the snapshot retention was last applied at
        self._last: list[View] = []  # the last round's views, and what the local copies were then
        self._marks: tuple[object, ...] = ()
        self._lease_ok = threading.Event()
        self._stop = threading.Event()

    # -- the lease ---------------------------------------------------------------------

    def _node(self, repo: Repository) -> rec.Node:
        return rec.Node(self.node, self.store, self.reach, shutil.disk_usage(repo.dir).free, self.lease)

    def _ensure_lease(self, repo: Repository) -> None:
        if not self._lease_ok.is_set():
            self.lease = self.registry.grant(TTL_S)
            self.registry.publish_node(self._node(repo))
            self._lease_ok.set()
            log.info("node %s alive on lease %x", self.node, self.lease)

    def _keepalive(self) -> None:
        while not self._stop.wait(max(TTL_S / 3, 0.3)):
            if not self._lease_ok.is_set():
                continue
            try:
                if not self.registry.refresh(self.lease):
                    self._lease_ok.clear()  # (expired: the loop grants a new one)
            except CasfsError as e:
                log.warning("lease refresh: %s", e)

    # -- the loop ----------------------------------------------------------------------

    def run(self, rounds: int | None = None) -> None:
        keeper = threading.Thread(target=self._keepalive, daemon=True)
        keeper.start()
        repo = Repository.open(self.store)
        seen, last = -1, 0.0
        try:
            while not self._stop.is_set() and (rounds is None or rounds > 0):
                rounds = None if rounds is None else rounds - 1
                try:
                    self._ensure_lease(repo)
                    now = self.registry.revision()
                    if now != seen or self._local_changed(repo) or time.monotonic() - last > 5:
                        last = time.monotonic()  # (and a full round every 5 s, whatever the signs say)
                        seen = now if self.round(repo) else -1
                except RegistryDown as e:
                    log.warning("%s; retrying", e)
                    self._lease_ok.clear()  # (decide nothing until a fresh lease and read)
                    self._stop.wait(1.0)
                    continue
                except CasfsError as e:
                    log.warning("round: %s", e)
                    seen = -1
                self._stop.wait(POLL_S)
        finally:
            self._stop.set()
            repo.close()

    def stop(self) -> None:
        """End run() after the round in progress (from another thread)."""
        self._stop.set()

    def _local_changed(self, repo: Repository) -> bool:
        """A local snapshot the registry has not heard of (an unmount, a periodic one)."""
        marks = tuple((v.name, local(repo, v.name)) for v in self._last)
        changed = marks != self._marks
        self._marks = marks
        return changed

    def round(self, repo: Repository) -> bool:
        """One pass over every volume; True when nothing is left to do (else again soon)."""
        views = self.registry.views()
        self._last = views
        load: dict[str, int] = {}
        for v in views:
            for e in v.entries:
                load[e.node] = load.get(e.node, 0) + 1
        done = True
        for v in views:
            done = self._volume(repo, v, load) and done
        self._local_changed(repo)
        return done

    def _volume(self, repo: Repository, v: View, load: dict[str, int]) -> bool:
        assert v.volume is not None
        mine, here = v.entry(self.node), local(repo, v.name)
        if mine is not None and mine.state == rec.LEAVING:
            return self._leave(repo, v, here)
        held = v.volume.active
        if here is not None and held is not None and held.node == self.node and not here[2]:
            if time.time() - held.since > GRACE_S:
                self._publish(v, here, release=True)
            return False  # (again soon: until it is mounted, or the grace is over)
        if here is not None and rec.diverged(self.node, here[0], here[1], v.entries):
            # Another node published this snapshot number first, with other content (this
            # node snapshotted while another held `active`): this line is kept, not published
            # (_keep_diverged says so in the log once it is kept).
            self._keep_diverged(repo, v.name)
            return False
        if here is not None and (
            mine is None or (mine.snapshot, mine.root) != here[:2] or mine.state != rec.OK
        ):
            self._publish(v, here)
            return False
        if mine is None:
            if rec.creator(v.volume, v.entries, v.nodes, load) == self.node:
                self._claim(v)
                return False
            return True
        if here is not None and here[2]:
            return self._while_mounted(repo, v)
        if here is not None and rec.keeper(v.volume, v.entries) == self.node:
            self._retain(repo, v.volume, here[0])
        source = rec.source_for(self.node, v.entries, v.alive)
        if source is None:
            return True
        self._pull(repo, v.name, source)
        return False

    def _while_mounted(self, repo: Repository, v: View) -> bool:
        """The volume is mounted here: its periodic snapshot when due (--snapshot-every)
        and changes were synced since the last one,
        retention on it; the round comes back while a period runs."""
        assert v.volume is not None
        every = v.volume.snapshot_every
        held = v.volume.active
        if every is None or held is None or held.node != self.node:
            return True
        last = self._periodic.setdefault(v.name, time.time())
        if time.time() - last >= every and rows.has_overlay(repo.conn, v.name):  # (changed since)
            self._periodic[v.name] = time.time()
            where = mountpoint(repo, v.name)
            if where is not None:
                try:
                    os.setxattr(where, "user.casfs.snapshot", b"")
                    log.info("periodic snapshot of %s (every %.0f s)", v.name, every)
                except OSError as e:
                    log.warning("periodic snapshot of %s at %s: %s", v.name, where, e)
        here = local(repo, v.name)
        if here is not None:
            self._retain(repo, v.volume, here[0])
        return False

    def _retain(self, repo: Repository, volume: rec.Volume, n: int) -> None:
        """The volume's retention policy applied here, once per new snapshot."""
        if volume.retention is None or self._kept.get(volume.name) == n:
            return
        self._kept[volume.name] = n
        policy = KeepPolicy.from_dict(volume.retention)
        if policy.empty:
            return
        gone = prune(repo, volume.name, policy)
        if gone:
            log.info("retention on %s removed snapshots %s", volume.name, gone)

    def _entry(self, v: View, here: tuple[int, str | None, bool] | None, state: str = rec.OK) -> rec.Entry:
        n, root = (here[0], here[1]) if here else (0, None)
        return rec.Entry(self.node, self.store, self.reach, n, root, state, time.time(), self.lease)

    def _publish(self, v: View, here: tuple[int, str | None, bool], release: bool = False) -> None:
        entry = self._entry(v, here)

        def decide(view: View) -> Change | None:
            if view.volume is None:
                return None
            volume = rec.release_active(view.volume, self.node) if release else None
            if rec.diverged(self.node, here[0], here[1], view.entries):  # (published meanwhile)
                return None if volume is None else Change(volume=volume)
            return Change(volume=volume, put=[entry])

        self.registry.change(v.name, decide)
        log.info("published %s@%d%s", v.name, here[0], " and released active" if release else "")

    def _claim(self, v: View) -> None:
        def decide(view: View) -> Change | None:
            if view.volume is None or view.entry(self.node) is not None:
                return None
            if rec.creator(view.volume, view.entries, view.nodes, {}) is None:
                return None  # (someone else filled the factor meanwhile)
            return Change(put=[self._entry(view, None)])

        self.registry.change(v.name, decide)
        log.info("creating a replica of %s here", v.name)

    def _leave(self, repo: Repository, v: View, here: tuple[int, str | None, bool] | None) -> bool:
        from casfs.volumes.create import remove_volume

        if here is not None:
            if here[2]:
                log.warning("%s is leaving this node but mounted here: kept until unmounted", v.name)
                return True
            remove_volume(repo, v.name, if_exists=True)
        self.registry.change(v.name, lambda view: Change(delete=[self.node]) if view.volume else None)
        log.info("removed the replica of %s here", v.name)
        return False

    def _pull(self, repo: Repository, volume: str, source: rec.Entry) -> None:
        from casfs.replica.active import opened, pull_from

        log.info("pulling %s@%d from %s (%s)", volume, source.snapshot, source.node, source.reach)
        if self.recover is not None:
            self.recover(repo)
        try:
            moved = pull_from(opened(repo), source, volume, self.remote, self.bwlimit)
        except (Conflict, Busy) as e:  # (diverged, or changes since its newest snapshot)
            log.warning("%s: %s", volume, e)
            self._keep_diverged(repo, volume)
            return
        log.info("pulled %s@%d: %d blobs", volume, moved.n, moved.blobs)

    def _keep_diverged(self, repo: Repository, volume: str) -> None:
        """This node's line of `volume` diverged from the registry's: keep it whole as
        VOL.diverged-NODE-N (its changes since the last snapshot in a snapshot first;
        a pull from this very store, so nothing moves and the copy owes nothing to VOL),
        then drop VOL here so that the next round pulls the registry's line afresh (the
        blobs both share are not fetched again)."""
        from casfs.replica.peers import Connection
        from casfs.replica.pull import pull
        from casfs.volumes.create import remove_volume
        from casfs.volumes.settle import settle

        with contextlib.suppress(CasfsError):
            settle(repo, volume)
        here = local(repo, volume)
        if here is None or here[2]:
            return
        keep = f"{volume}.diverged-{self.node}-{here[0]}"
        with Connection(self.store, self.remote) as conn:
            pull(repo, conn, volume, SnapshotNo(here[0]), keep)
        remove_volume(repo, volume)
        log.warning("kept this node's diverged line of %s as %s; following the registry's", volume, keep)
