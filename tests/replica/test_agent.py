"""Replicated volumes end to end: a real etcd, three stores as three nodes, an agent
each (`casfs replica agent`, pulling over the test sshd), real FUSE mounts through the
CLI. Polls have deadlines; nothing is timed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from tests.helpers.cli import CLI
from tests.helpers.mount import fsync, is_mounted
from tests.helpers.procs import stopped
from tests.helpers.snapshots import wait_until
from tests.replica.cluster import Cluster, Etcd, cluster, etcd

__all__ = ["cluster", "etcd"]  # (the fixtures, for pytest)


def replicated(c: Cluster, factor: int = 3) -> None:
    """Volume v made on n1 (a blank directory volume with one snapshot), factor `factor`,
    agents on every node, and every node holding v@1."""
    c.ok("n1", "volume", "create", "v", "--blank-dir")
    c.ok("n1", "snapshot", "create", "v")
    c.ok("n1", "replica", "set-factor", "v", str(factor))
    for name in c.nodes:
        c.start_agent(name)
    wait_until("v@1 on every node", lambda: c.all_hold("v", 1))


def write_and_unmount(c: Cluster, node: str, name: str, text: str) -> tuple[Path, int]:
    where, p = c.mount(node, "v")
    assert p.returncode == 0, p.stderr
    (where / name).write_text(text)
    done = c.umount(node, where)
    assert done.returncode == 0, done.stderr
    n = int(done.stdout.split("@")[-1])
    return where, n


def test_factor_three_follows_unmounts_and_active_moves(cluster: Cluster) -> None:
    c = cluster
    replicated(c)
    rows = c.replicas("v")
    assert set(rows) == {"n1", "n2", "n3"} and all(r["healthy"] for r in rows.values())

    # n1 writes; a read/write mount elsewhere is refused while n1 holds `active`
    where, p = c.mount("n1", "v")
    assert p.returncode == 0, p.stderr
    (where / "a").write_text("from n1")
    assert c.record("v")["active"] == "n1"
    elsewhere, refused = c.mount("n2", "v")
    assert refused.returncode == 4 and "n1" in refused.stderr, refused.stderr
    assert not is_mounted(elsewhere)
    done = c.umount("n1", where)
    assert done.returncode == 0, done.stderr
    wait_until("v@2 on every node after n1's unmount", lambda: c.all_hold("v", 2))
    assert c.record("v")["active"] is None

    # n2 takes `active` now; n1 and n3 follow its unmount
    _, n = write_and_unmount(c, "n2", "b", "from n2")
    assert n == 3
    wait_until("v@3 on every node after n2's unmount", lambda: c.all_hold("v", 3))
    where3, p = c.mount("n3", "v", "--ro")
    assert p.returncode == 0, p.stderr
    assert (where3 / "a").read_text() == "from n1" and (where3 / "b").read_text() == "from n2"
    assert c.umount("n3", where3).returncode == 0


def test_mount_catches_up_first(cluster: Cluster) -> None:
    """n2's agent stopped (SIGSTOP: still alive on its lease, of 60 s here, but following
    nothing) before n1's unmount: n2's mount itself pulls the snapshot that took."""
    c = cluster
    replicated(c)
    c.kill_agent("n2")
    c.start_agent("n2", ttl=60)
    wait_until("n2's agent on its new lease", lambda: c.replicas("v")["n2"]["alive"])
    n2 = c.nodes["n2"].agent
    assert n2 is not None
    where, p = c.mount("n1", "v")
    assert p.returncode == 0, p.stderr
    (where / "a").write_text("new")
    os.kill(n2.pid, signal.SIGSTOP)
    try:
        assert c.umount("n1", where).returncode == 0
        assert c.local_snapshots("n2", "v") == [1]
        where2, p = c.mount("n2", "v")
        assert p.returncode == 0, p.stderr
        assert (where2 / "a").read_text() == "new"
        assert c.local_snapshots("n2", "v") == [1, 2]
        assert c.umount("n2", where2).returncode == 0
    finally:
        os.kill(n2.pid, signal.SIGCONT)


def test_rm_keeps_the_factor_and_races_leave_k(cluster: Cluster) -> None:
    c = cluster
    replicated(c)
    refused = c.run("n3", "replica", "rm", "v")
    assert refused.returncode == 4 and "fewer than 3" in refused.stderr, refused.stderr
    c.ok(None, "replica", "set-factor", "v", "2")
    # two removals racing (n2's and n3's): at most one wins, at least 2 replicas stay
    procs = [
        subprocess.Popen([*CLI, "replica", "rm", "v", "--node", node], env=c.env(node),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in ("n2", "n3")
    ]  # fmt: skip
    said = [p.communicate(timeout=60)[1] for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 4], said
    gone = "n2" if codes[0] == 0 else "n3"
    wait_until(f"{gone}'s agent deleted its copy", lambda: not c.local_snapshots(gone, "v"))
    wait_until(f"{gone}'s entry is gone", lambda: gone not in c.replicas("v"))
    left = c.replicas("v")
    assert len(left) == 2 and all(r["healthy"] for r in left.values())
    # the last good copies stay: neither may go now
    for node in left:
        assert c.run(node, "replica", "rm", "v").returncode == 4
    # a replica asked for beyond the factor: that node's agent pulls it
    c.ok(None, "replica", "add", "v", "--node", gone)
    wait_until(f"{gone} holds v again", lambda: c.all_hold("v", 1))
    wait_until(f"{gone}'s entry healthy", lambda: c.replicas("v")[gone]["healthy"])


def test_etcd_down_mounts_keep_working(cluster: Cluster, etcd: Etcd) -> None:
    c = cluster
    replicated(c)
    where, p = c.mount("n1", "v")
    assert p.returncode == 0, p.stderr
    etcd.stop()
    try:
        (where / "during").write_text("written while etcd was down")
        # a decision needs the registry: a mount elsewhere is refused, nothing changed
        down = c.run("n2", "mount", c.tmp / "x", "--volume", "v")
        assert down.returncode == 1 and "unreachable" in down.stderr, down.stderr
        done = c.umount("n1", where)  # (unmounts; the agent publishes once etcd is back)
        assert done.returncode == 0, done.stderr
        assert "registry" in done.stderr
    finally:
        etcd.start()
    wait_until("v@2 on every node once etcd is back", lambda: c.all_hold("v", 2))
    assert all(a.agent is not None and a.agent.poll() is None for a in c.nodes.values())


def test_takeover_keeps_the_old_nodes_divergent_line(cluster: Cluster) -> None:
    c = cluster
    replicated(c)
    where, p = c.mount("n1", "v")
    assert p.returncode == 0, p.stderr
    (where / "n1-only").write_text("acknowledged on n1")
    fsync(where / "n1-only")
    (run_file,) = (c.nodes["n1"].store / "run").glob("*.json")
    daemon = int(json.loads(run_file.read_text())["pid"])
    c.kill_agent("n1")
    os.kill(daemon, signal.SIGKILL)
    wait_until("n1 not alive", lambda: not c.replicas("v")["n1"]["alive"])
    taken, p = c.mount("n2", "v")
    assert p.returncode == 0, p.stderr
    assert "taking over" in p.stderr
    (taken / "n2").write_text("on n2")
    assert c.umount("n2", taken).returncode == 0
    record = c.record("v")
    assert [(t["old"], t["new"]) for t in record["takeovers"]] == [("n1", "n2")]
    wait_until("v@2 on n3", lambda: c.all_hold("v", 2, ("n2", "n3")))
    subprocess.run(["fusermount3", "-u", "-z", str(where)], capture_output=True, timeout=30)
    c.start_agent("n1")
    kept = "v.diverged-n1-2"
    wait_until(
        "n1 keeps its line and follows n2's", lambda: c.all_hold("v", 2, ("n1",)) and kept in volumes(c, "n1")
    )
    old, _ = c.mount("n1", kept, "--ro")
    assert (old / "n1-only").read_text() == "acknowledged on n1"
    assert c.umount("n1", old).returncode == 0


def test_a_snapshot_made_offline_under_a_taken_number_is_kept_not_published(cluster: Cluster) -> None:
    """n1 snapshots v without the registry while n2 publishes v@2: n1's v@2 is another
    line under the same number. n1's agent keeps it aside and follows n2's; it is never
    published (where it would count as a healthy replica of v@2, and neither would pull)."""
    c = cluster
    replicated(c)
    c.kill_agent("n1")
    write_and_unmount(c, "n2", "from-n2", "on n2")
    wait_until("n2 publishes v@2", lambda: c.replicas("v")["n2"]["snapshot"] == 2)
    offline = c.tmp / "offline"
    offline.mkdir()
    p = c.run("n1", "mount", offline, "--volume", "v", CASFS_REGISTRY="")
    assert p.returncode == 0, p.stderr
    c.mounts.append(offline)
    (offline / "from-n1").write_text("on n1, offline")
    assert c.run("n1", "umount", offline, CASFS_REGISTRY="").returncode == 0
    assert c.local_snapshots("n1", "v")[-1] == 2
    c.start_agent("n1")
    kept = "v.diverged-n1-2"
    wait_until("n1 keeps its line aside", lambda: kept in volumes(c, "n1"))
    n2_root = c.replicas("v")["n2"]["root"]
    wait_until("n1 follows n2's v@2", lambda: c.replicas("v")["n1"]["root"] == n2_root)
    assert c.replicas("v")["n1"]["snapshot"] == 2
    follows, p = c.mount("n1", "v", "--ro")
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(follows)) == ["from-n2"]
    assert c.umount("n1", follows).returncode == 0
    old, p = c.mount("n1", kept, "--ro")
    assert p.returncode == 0, p.stderr
    assert (old / "from-n1").read_text() == "on n1, offline"
    assert c.umount("n1", old).returncode == 0


def volumes(c: Cluster, node: str) -> list[str]:
    return [v["name"] for v in json.loads(c.ok(node, "volume", "ls", "--json"))]


def test_periodic_snapshots_reach_the_followers_while_mounted(cluster: Cluster) -> None:
    c = cluster
    replicated(c)
    where, p = c.mount("n1", "v", "--snapshot-every", "1s")
    assert p.returncode == 0, p.stderr
    assert c.record("v")["snapshot_every"] == 1.0
    (where / "kept").write_text("before any unmount")
    fsync(where / "kept")
    wait_until("a periodic snapshot on every node while n1 is mounted", lambda: c.all_reach("v", 2))
    assert is_mounted(where) and c.record("v")["active"] == "n1"
    # The record's retention, applied by the active node's agent at each new snapshot.
    c.ok("n1", "replica", "set-factor", "v", "3", "--keep-last", "2")

    def newest_on_n1() -> int:
        return max(c.local_snapshots("n1", "v"))

    for i in range(3):
        (where / f"more{i}").write_text(str(i))
        fsync(where / f"more{i}")
        wait_until(f"periodic snapshot {3 + i} on n1", lambda: newest_on_n1() >= 3 + i)  # noqa: B023 (waited for here)
    wait_until("n1 pruned to its last 2", lambda: len(c.local_snapshots("n1", "v")) == 2)
    assert c.umount("n1", where).returncode == 0
    shown, p = c.mount("n3", "v", "--ro")
    assert p.returncode == 0, p.stderr
    assert (shown / "kept").read_text() == "before any unmount"
    assert (shown / "more2").read_text() == "2"
    assert c.umount("n3", shown).returncode == 0


def test_agent_killed_during_a_pull_resumes(cluster: Cluster) -> None:
    """n2's agent stops itself in the middle of a pull (CASFS_STOP), is killed -9 there;
    nothing of the snapshot is visible on n2 until its next agent finishes the pull."""
    c = cluster
    replicated(c)
    c.kill_agent("n2")
    where, p = c.mount("n1", "v")
    assert p.returncode == 0, p.stderr
    (where / "big").write_bytes(os.urandom(12 << 20))  # (several batches)
    assert c.umount("n1", where).returncode == 0
    c.start_agent("n2", CASFS_STOP="pull:batch")
    agent = c.nodes["n2"].agent
    assert agent is not None
    wait_until("n2's agent stopped mid-pull", lambda: stopped(agent.pid))
    c.kill_agent("n2")
    assert c.local_snapshots("n2", "v") == [1]
    c.start_agent("n2")
    wait_until("n2 holds v@2", lambda: c.all_hold("v", 2))
    shown, p = c.mount("n2", "v", "--ro")
    assert p.returncode == 0, p.stderr
    assert (shown / "big").stat().st_size == 12 << 20
    assert c.umount("n2", shown).returncode == 0
