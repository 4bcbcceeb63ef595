"""The registry against a real etcd: compare-and-swap under real concurrent clients,
leases, the URL and its errors (casfs.replica.registry, `casfs replica` exit codes)."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from casfs.errors import Busy, NotFound, UsageError
from casfs.replica import records as rec
from casfs.replica.registry import Change, Registry, RegistryDown, View
from tests.helpers.cli import CLI, env
from tests.helpers.snapshots import wait_until
from tests.replica.cluster import Etcd, etcd, free_port

__all__ = ["etcd"]


def fresh(etcd: Etcd, name: str) -> Registry:
    reg = Registry(etcd.url(f"reg-{name}-{time.monotonic_ns()}"))
    reg.change("v", lambda view: Change(volume=rec.Volume("v", 1, "dir", {})))
    return reg


def test_two_racers_never_both_win(etcd: Etcd) -> None:
    reg = fresh(etcd, "race")
    a, b = Registry(reg.url), Registry(reg.url)
    seen = a.view("v")
    assert b.view("v").record_rev == seen.record_rev
    assert seen.volume is not None
    wins = [c.commit(seen, Change(volume=replace(seen.volume, factor=k))) for c, k in ((a, 2), (b, 3))]
    assert wins == [True, False]
    after = a.view("v").volume
    assert after is not None and after.factor == 2


def test_concurrent_changes_lose_no_update(etcd: Etcd) -> None:
    """Eight threads, each its own client, each adding its entry and raising the factor
    by one through change(): every one of them lands."""
    reg = fresh(etcd, "many")
    errors: list[BaseException] = []

    def add(i: int) -> None:
        mine = Registry(reg.url)

        def decide(view: View) -> Change:
            assert view.volume is not None
            return Change(volume=replace(view.volume, factor=view.volume.factor + 1),
                          put=[rec.Entry(f"n{i}", "/s", "/s")])  # fmt: skip

        try:
            mine.change("v", decide)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    view = reg.view("v")
    assert view.volume is not None and view.volume.factor == 9
    assert sorted(e.node for e in view.entries) == sorted(f"n{i}" for i in range(8))


def test_a_refusing_decision_changes_nothing(etcd: Etcd) -> None:
    reg = fresh(etcd, "refuse")
    before = reg.view("v").record_rev

    def refuse(view: View) -> Change:
        raise Busy("no")

    with pytest.raises(Busy):
        reg.change("v", refuse)
    assert reg.view("v").record_rev == before


def test_a_node_lives_on_its_lease(etcd: Etcd) -> None:
    reg = fresh(etcd, "lease")
    lease = reg.grant(1)
    reg.publish_node(rec.Node("n1", "/s", "/s", 10, lease))
    assert [n.name for n in reg.nodes()] == ["n1"]
    assert reg.refresh(lease)
    wait_until("the node key gone with its lease", lambda: not reg.nodes(), 30)
    assert not reg.refresh(lease)


def test_a_takeover_needs_the_old_node_still_absent(etcd: Etcd) -> None:
    reg = fresh(etcd, "takeover")
    seen = reg.view("v")
    lease = reg.grant(30)
    reg.publish_node(rec.Node("n1", "/s", "/s", 10, lease))  # (n1 came back after the read)
    assert seen.volume is not None
    taken = rec.take_active(seen.volume, "n2", 1, set(), 0, 0.0)
    assert not reg.commit(seen, Change(volume=taken, absent_nodes=["n1"]))
    reg.revoke(lease)


def test_bad_urls_are_usage_errors() -> None:
    for url in ("http://127.0.0.1:2379/x", "etcd:///x", "etcd://host/x", "etcd://h:p/x"):
        with pytest.raises(UsageError):
            Registry(url)


def test_unreachable_is_one_clear_error(tmp_path: Path) -> None:
    down = Registry(f"etcd://127.0.0.1:{free_port()}/x")
    with pytest.raises(RegistryDown, match="unreachable"):
        down.view("v")
    p = subprocess.run(
        [*CLI, "replica", "ls"], capture_output=True, text=True, timeout=60,
        env=env(CASFS_REGISTRY=down.url),
    )  # fmt: skip
    assert p.returncode == 1 and p.stderr.startswith("casfs: error: registry") and "unreachable" in p.stderr


def test_cli_errors_map_to_exit_codes(etcd: Etcd, tmp_path: Path) -> None:
    url = etcd.url(f"cli-{time.monotonic_ns()}")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "-s", str(tmp_path / "s"), *args], capture_output=True, text=True,
                              timeout=60, env=env(CASFS_REGISTRY=url))  # fmt: skip

    assert run("init").returncode == 0
    assert run("replica", "ls", "nothere").returncode == NotFound.exit_code
    assert run("replica", "set-factor", "nothere", "2").returncode == NotFound.exit_code
    assert run("volume", "create", "v", "--blank-dir").returncode == 0
    assert run("replica", "set-factor", "v", "0").returncode == UsageError.exit_code
    assert run("replica", "set-factor", "v", "x").returncode == UsageError.exit_code
    assert run("replica", "set-factor", "v", "2").returncode == 0
    assert run("replica", "add", "v", "--node", "nobody").returncode == NotFound.exit_code
    assert run("replica", "rm", "v", "--node", "nobody").returncode == Busy.exit_code
    no_registry = subprocess.run(
        [*CLI, "replica", "ls"], capture_output=True, text=True, timeout=60, env=env()
    )
    assert no_registry.returncode == UsageError.exit_code and "CASFS_REGISTRY" in no_registry.stderr
