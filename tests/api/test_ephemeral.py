"""Ephemeral volumes: `volume create --grace D`; `casfs gc` removes those unused for
longer than D (and frees what only they held), and never one that is mounted."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from casfs import volumes
from casfs.catalog import volumes as rows
from casfs.repo import Repository
from casfs.units import parse_duration
from casfs.upkeep.ephemeral import expire
from tests.helpers.cli import casfs, js, ok
from tests.helpers.fsck import assert_consistent

HAVE_DAEMON = importlib.util.find_spec("casfs.fuse.daemon") is not None


def test_durations() -> None:
    assert [parse_duration(t) for t in ("30s", "10m", "2h", "1d", "90", "0.5s")] == [
        30,
        600,
        7200,
        86400,
        90,
        0.5,
    ]
    for bad in ("", "0", "-1s", "10x", "1.5.2m"):
        with pytest.raises(Exception, match="invalid duration"):
            parse_duration(bad)


def test_gc_removes_expired_ephemeral_volumes(store: Path) -> None:
    ok(store, "volume", "create", "eph", "--blank-block", "64M", "--grace", "0.3s")
    ok(store, "volume", "create", "later", "--blank-dir", "--grace", "1h")
    ok(store, "volume", "create", "kept", "--blank-dir")
    info = js(store, "volume", "info", "eph")
    assert info["grace_s"] == 0.3 and info["last_used"] == pytest.approx(info["created"], abs=1)
    assert "ephemeral" in ok(store, "volume", "info", "eph").stdout
    assert casfs(store, "volume", "create", "bad", "--blank-dir", "--grace", "soon").returncode == 2
    time.sleep(0.4)

    p = ok(store, "gc")
    assert "removed ephemeral volume eph" in p.stdout
    assert sorted(v["name"] for v in js(store, "volume", "ls")) == ["kept", "later"]
    assert js(store, "gc")["expired_volumes"] == []
    assert_consistent(store)


def test_touch_and_holders_keep_a_volume(store: Path) -> None:
    ok(store, "volume", "create", "src", "--blank-dir", "--grace", "10s")
    ok(store, "snapshot", "create", "src")
    ok(store, "volume", "create", "child", "--from", "src@1")
    ok(store, "volume", "create", "v", "--blank-dir", "--grace", "10s")
    repo = Repository.open(store)
    try:
        created = volumes.get_volume(repo, "v").created
        rows.touch(repo.conn, "v")
        used = volumes.get_volume(repo, "v").last_used
        assert used is not None and used >= created
        kept: list[str] = []
        assert expire(repo, now=used + 9.9, kept=kept) == []
        # Past the grace: v goes; src stays, a volume was made from its snapshot.
        assert expire(repo, now=used + 10.1, kept=kept) == ["v"]
        assert kept and all(k.startswith("src: ") and "child" in k for k in kept)
    finally:
        repo.close()
    assert_consistent(store)


@pytest.mark.skipif(not HAVE_DAEMON, reason="casfs.fuse.daemon is not in this tree yet")
def test_mounted_ephemeral_volumes_are_kept(store: Path, tmp_path: Path) -> None:
    from tests.helpers.mount import mounted

    for name in ("rw", "ro", "idle"):
        ok(store, "volume", "create", name, "--blank-dir", "--grace", "0.5s")
    time.sleep(0.6)
    with (
        mounted(store, tmp_path / "m-rw", volume="rw"),
        mounted(store, tmp_path / "m-ro", volume="ro", ro=True),
    ):
        assert js(store, "volume", "info", "rw")["phase"] == "mounted"
        assert js(store, "gc")["expired_volumes"] == ["idle"]
    time.sleep(0.6)  # the unmount may count as a use
    assert js(store, "gc")["expired_volumes"] == ["ro", "rw"]
    assert js(store, "volume", "ls") == []
    assert_consistent(store)
