"""Replica bookkeeping: numbers and roots kept, where each snapshot came from, peers as
last seen; a replica mounted at once (read-only, or read/write and pulled back by its
origin); diverged lines refused; `volume rm --if-replicated` asking peers live."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

from tests.helpers.mount import mounted
from tests.replica.conftest import Sshd
from tests.replica.helpers import MiB, block_volume, cli, exported, root_of, write_block


def pull(store: Path, *args: str | Path) -> dict[str, object]:
    p = cli(store, "pull", *args, "--json")
    assert p.returncode == 0, p.stderr
    doc: dict[str, object] = json.loads(p.stdout)
    return doc


def info(store: Path, name: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads(cli(store, "volume", "info", name, "--json").stdout)
    return doc


def peers_seen(store: Path) -> list[float]:
    peers = info(store, "vm1")["peers"]
    assert isinstance(peers, list)
    return [float(p["seen"]) for p in peers]


def test_info_shows_the_newest_where_each_came_from_and_the_peers(
    two: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two
    block_volume(a, tmp_path, "vm1", 4 * MiB, os.urandom(MiB))
    write_block(a, "vm1", [(0, b"a" * 4096)])
    pull(b, a, "vm1")
    n = write_block(b, "vm1", [(0, b"b" * 4096)])  # the replica's own next snapshot
    assert n == 2
    d = info(b, "vm1")
    assert d["newest_snapshot"] == 2
    sources = d["snapshot_sources"]
    assert isinstance(sources, dict)
    assert sources["1"]["source"] == str(a) and sources["1"]["taken_by"] == info(a, "vm1")["store_id"]
    assert sources["2"]["source"] is None and sources["2"]["taken_by"] == d["store_id"]
    peers = d["peers"]
    assert isinstance(peers, list)
    assert [(p["source"], p["newest"], p["root"]) for p in peers] == [(str(a), 1, root_of(a, "vm1@1"))]
    text = cli(b, "volume", "info", "vm1").stdout.decode()
    assert f"from {a}" in text and "taken here" in text and f"peer {a}" in text


def test_a_replica_mounts_read_only_at_once(two: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "hello").write_bytes(b"replicated\n")
    assert cli(a, "image", "import", "t", tmp_path / "src").returncode == 0
    assert cli(a, "volume", "create", "ct", "--from", "t").returncode == 0
    assert cli(a, "snapshot", "create", "ct").returncode == 0
    pull(b, a, "ct")
    with mounted(b, tmp_path / "mnt", volume="ct", ro=True) as m:
        assert (m.path / "hello").read_bytes() == b"replicated\n"


def test_a_replica_written_becomes_n_plus_1_and_its_origin_pulls_it_back(
    two: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two
    block_volume(a, tmp_path, "vm1", 4 * MiB, os.urandom(MiB))
    write_block(a, "vm1", [(0, b"a" * 4096)])
    write_block(a, "vm1", [(4096, b"a" * 4096)])  # vm1@2
    pull(b, a, "vm1")
    disk = tmp_path / "vm1.img"
    disk.touch()
    with mounted(b, disk, volume="vm1") as m:
        fd = os.open(m.path, os.O_WRONLY)
        os.pwrite(fd, b"written on the replica", 3 * MiB)
        os.fsync(fd)
        os.close(fd)
    assert cli(b, "snapshot", "ls", "vm1").stdout.decode().count("vm1@") == 2  # 2 (received) and 3
    doc = pull(a, b, "vm1")
    assert (doc["n"], doc["plan"]) == (3, "next")
    assert root_of(a, "vm1@3") == root_of(b, "vm1@3")
    img = exported(a, "vm1@3", tmp_path / "a3.img")
    assert img[3 * MiB : 3 * MiB + 22] == b"written on the replica"
    assert json.loads(cli(a, "volume", "info", "vm1", "--json").stdout)["base"] == root_of(b, "vm1@3")


def test_diverged_lines_are_refused_and_kept_apart_with_as(two: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two
    block_volume(a, tmp_path, "vm1", 4 * MiB, os.urandom(MiB))
    write_block(a, "vm1", [(0, b"a" * 4096)])
    pull(b, a, "vm1")
    write_block(a, "vm1", [(0, b"on a" * 1024)])  # a's vm1@2
    write_block(b, "vm1", [(0, b"on b" * 1024)])  # b's vm1@2
    before = cli(b, "snapshot", "ls", "vm1", "--json").stdout
    p = cli(b, "pull", a, "vm1")
    assert p.returncode == 4, p.stderr
    message = p.stderr.decode()
    assert root_of(a, "vm1@2") in message and root_of(b, "vm1@2") in message
    assert cli(b, "snapshot", "ls", "vm1", "--json").stdout == before
    doc = pull(b, a, "vm1", "--as", "vm1-from-a")
    assert (doc["volume"], doc["n"]) == ("vm1-from-a", 2)
    assert root_of(b, "vm1-from-a@2") == root_of(a, "vm1@2") != root_of(b, "vm1@2")
    # a's own next snapshot, never seen by b, also counts as divergence
    write_block(b, "vm1", [(0, b"b again" * 100)])  # b's vm1@3
    assert cli(a, "pull", b, "vm1").returncode == 4


def test_rm_if_replicated_asks_the_peers_live(two: tuple[Path, Path], tmp_path: Path, sshd: Sshd) -> None:
    a, b = two
    ssh = {"CASFS_SSH": sshd.ssh, "CASFS_REMOTE": sshd.remote}
    block_volume(a, tmp_path, "vm1", 4 * MiB, os.urandom(MiB))
    write_block(a, "vm1", [(0, b"a" * 4096)])
    p = cli(b, "pull", sshd.url(a), "vm1", extra=ssh)
    assert p.returncode == 0, p.stderr
    # a knows b once it pulled from it (finding nothing new: b is as new, not newer)
    assert cli(a, "pull", b, "vm1").returncode == 0
    write_block(a, "vm1", [(0, b"newer" * 1000)])  # a's vm1@2: b is behind now
    p = cli(a, "volume", "rm", "vm1", "--if-replicated", "1")
    assert p.returncode == 4 and b"newest vm1@1" in p.stderr, p.stderr
    assert cli(b, "pull", sshd.url(a), "vm1", extra=ssh).returncode == 0  # b catches up
    assert cli(b, "volume", "rm", "vm1", "--if-replicated", "2", extra=ssh).returncode == 4  # one peer only
    p = cli(a, "volume", "rm", "vm1", "--if-replicated", "1")
    assert p.returncode == 0, p.stderr
    assert cli(a, "volume", "info", "vm1").returncode == 3
    # b's peer (a) no longer holds it: b's copy is the last one and stays
    p = cli(b, "volume", "rm", "vm1", "--if-replicated", "1", extra=ssh)
    assert p.returncode == 4 and b"no volume" in p.stderr, p.stderr


def test_a_snapshot_taken_here_that_the_source_went_past_is_divergence(
    two: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two
    block_volume(a, tmp_path, "vm1", 4 * MiB, os.urandom(MiB))
    write_block(a, "vm1", [(0, b"a" * 4096)])  # vm1@1
    pull(b, a, "vm1")
    write_block(b, "vm1", [(0, b"b" * 4096)])  # b's vm1@2
    write_block(a, "vm1", [(0, b"2" * 4096)])  # a's vm1@2 ...
    write_block(a, "vm1", [(0, b"3" * 4096)])  # ... and vm1@3
    assert cli(a, "snapshot", "rm", "vm1@2").returncode == 0  # its bookmark stays: 2 is known
    p = cli(b, "pull", a, "vm1")
    assert p.returncode == 4 and b"snapshot 2 is" in p.stderr, p.stderr
    # A source without bookmarks (an older casfs's) has no number left in common but 1.
    with sqlite3.connect(a / "catalog.db") as conn:
        conn.execute("DELETE FROM bookmarks")
    conn.close()
    p = cli(b, "pull", a, "vm1")
    assert p.returncode == 4 and b"snapshot 2 was taken here" in p.stderr, p.stderr


def test_a_pull_of_what_is_held_fails_if_the_peer_cannot_be_recorded(
    two: tuple[Path, Path], tmp_path: Path
) -> None:
    """A pull that finds the snapshot held only records the peer: a failure to record it
    is reported, not swallowed into a success with stale peer rows."""
    a, b = two
    block_volume(a, tmp_path, "vm1", 4 * MiB, os.urandom(MiB))
    write_block(a, "vm1", [(0, b"a" * 4096)])
    assert pull(b, a, "vm1")["plan"] != "have"
    (seen,) = peers_seen(b)
    trigger = "CREATE TRIGGER refuse BEFORE INSERT ON peers BEGIN SELECT RAISE(ABORT, 'peers refused'); END"
    subprocess.run(["sqlite3", str(b / "catalog.db"), trigger], check=True)
    p = cli(b, "pull", a, "vm1")
    assert p.returncode == 1 and b"peers refused" in p.stderr
    assert peers_seen(b) == [seen]
    subprocess.run(["sqlite3", str(b / "catalog.db"), "DROP TRIGGER refuse"], check=True)
    assert pull(b, a, "vm1")["plan"] == "have"
    (again,) = peers_seen(b)
    assert again > seen
