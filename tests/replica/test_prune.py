"""Retention (`casfs snapshot prune`) and what pulls do after it: the source pruned the
snapshot a replica holds as newest, and the next pull still moves only the change
(the receiver walks from its own base) and still refuses a diverged line (the pruned
snapshot's bookmark keeps its number and root). `--bwlimit` pulls complete as well.
The stores are fsck'd when each test ends (the `stores` fixture)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from casfs.repo import Repository
from tests.helpers.fsck import Stores, query
from tests.replica.helpers import MiB, block_volume, cli, exported, root_of, write_block
from tests.replica.test_pull import pull

CHANGE = 256 << 10


def prune(store: Path, vol: str, *rules: str) -> dict[str, Any]:
    p = cli(store, "snapshot", "prune", vol, *rules, "--json")
    assert p.returncode == 0, p.stderr
    doc: dict[str, Any] = json.loads(p.stdout)
    return doc


def numbers(store: Path, vol: str) -> list[int]:
    return [n for (n,) in query(store, "SELECT n FROM snapshots WHERE volume = ? ORDER BY n", vol)]


def refused(p: subprocess.CompletedProcess[bytes], code: int, words: bytes) -> None:
    assert p.returncode == code and words in p.stderr, (p.returncode, p.stderr)


def b_goes_on(a: Path, b: Path, tmp_path: Path) -> tuple[int, int]:
    """vm1@N made on a and pulled by b, then b's own next snapshot: (N, b's)."""
    block_volume(a, tmp_path, "vm1", 8 * MiB, os.urandom(MiB))
    first = write_block(a, "vm1", [(0, os.urandom(CHANGE))])
    pull(b, str(a), "vm1")
    return first, write_block(b, "vm1", [(MiB, os.urandom(CHANGE))])


def test_after_the_source_pruned_the_replicas_newest_a_pull_moves_only_the_change(
    two: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two
    # (96 MiB: a map of pages, each change in another one, paired with the base's page)
    block_volume(a, tmp_path, "vm1", 96 * MiB, os.urandom(4 * MiB))
    held = write_block(a, "vm1", [(80 * MiB, os.urandom(MiB))])
    assert pull(b, str(a), "vm1")["n"] == held
    write_block(a, "vm1", [(0, os.urandom(CHANGE))])
    newest = write_block(a, "vm1", [(90 * MiB, os.urandom(CHANGE))])
    doc = prune(a, "vm1", "--keep-last", "1")
    assert held in doc["removed"] and numbers(a, "vm1") == [newest]
    assert query(a, "SELECT n FROM bookmarks WHERE volume = 'vm1' AND n = ?", held) == [(held,)]

    moved = pull(b, str(a), "vm1")
    assert (moved["n"], moved["plan"]) == (newest, "next")
    assert int(str(moved["bytes"])) < 2 * CHANGE * 1.2 + 200_000  # the change and the map, not 16 MiB
    assert root_of(b, f"vm1@{newest}") == root_of(a, f"vm1@{newest}")
    assert exported(a, f"vm1@{newest}", tmp_path / "a.img") == exported(
        b, f"vm1@{newest}", tmp_path / "b.img"
    )
    # The replica prunes its own the same way; the pulled snapshot stays its newest.
    assert prune(b, "vm1", "--keep-last", "1")["removed"] == [held]
    assert numbers(b, "vm1") == [newest]


def test_a_line_that_diverged_before_the_pruned_snapshot_is_still_refused(
    two: tuple[Path, Path], tmp_path: Path, stores: Stores
) -> None:
    a, b = two
    c = stores.add(tmp_path / "c")
    Repository.init(c).close()
    first, theirs = b_goes_on(a, b, tmp_path)
    assert pull(c, str(b), "vm1")["n"] == theirs  # b went on by itself, and c follows b
    ours = write_block(a, "vm1", [(2 * MiB, os.urandom(CHANGE))])  # a takes the same number
    assert ours == theirs
    newest = write_block(a, "vm1", [(3 * MiB, os.urandom(CHANGE))])
    assert prune(a, "vm1", "--keep-last", "1")["removed"] == [first, ours]

    # c's newest was taken by b, not here: only a's bookmark of that number shows the split.
    before = query(c, "SELECT volume, n, root FROM snapshots ORDER BY volume, n")
    refused(cli(c, "pull", str(a), "vm1"), 4, b"has diverged")
    refused(cli(b, "pull", str(a), "vm1"), 4, b"has diverged")  # (b's own snapshot)
    assert query(c, "SELECT volume, n, root FROM snapshots ORDER BY volume, n") == before
    kept = pull(c, str(a), "vm1", "--as", "vm1-a")
    assert (kept["n"], kept["plan"]) == (newest, "new")


def test_a_snapshot_the_source_took_from_here_and_pruned_is_still_the_same_line(
    two: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two
    _, mine = b_goes_on(a, b, tmp_path)  # taken on b, pulled back by a
    assert pull(a, str(b), "vm1")["n"] == mine
    newest = write_block(a, "vm1", [(2 * MiB, os.urandom(CHANGE))])
    prune(a, "vm1", "--keep-last", "1")  # a keeps no snapshot b has, only their bookmarks
    moved = pull(b, str(a), "vm1")
    assert (moved["n"], moved["plan"]) == (newest, "next")


def test_prune_keeps_what_volumes_are_made_from_and_dry_run_removes_nothing(
    two: tuple[Path, Path], tmp_path: Path
) -> None:
    a, _ = two
    block_volume(a, tmp_path, "vm1", 4 * MiB, os.urandom(MiB))
    made = [write_block(a, "vm1", [(0, os.urandom(CHANGE))]) for _ in range(4)]
    assert cli(a, "volume", "create", "clone", "--from", f"vm1@{made[1]}").returncode == 0
    dry = cli(a, "snapshot", "prune", "vm1", "--keep-last", "1", "--dry-run")
    assert dry.returncode == 0 and f"would remove vm1@{made[0]}".encode() in dry.stdout, dry.stdout
    assert numbers(a, "vm1") == made
    doc = prune(a, "vm1", "--keep-last", "1")
    assert doc["removed"] == [made[0], made[2]]
    assert doc["kept"] == [{"n": made[1], "why": ["in use"]}, {"n": made[3], "why": ["newest", "last"]}]
    assert numbers(a, "vm1") == [made[1], made[3]]


def test_bad_prune_input_is_refused_and_removes_nothing(two: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = two
    block_volume(a, tmp_path, "vm1", 4 * MiB, os.urandom(MiB))
    made = [write_block(a, "vm1", [(0, os.urandom(CHANGE))]) for _ in range(2)]
    refused(cli(a, "snapshot", "prune", "vm1"), 2, b"at least one of keep-last")
    refused(cli(a, "snapshot", "prune", "vm1", "--keep-last", "0"), 2, b"invalid --keep-last")
    refused(cli(a, "snapshot", "prune", "vm1", "--keep-daily", "x"), 2, b"invalid --keep-daily")
    refused(cli(a, "snapshot", "prune", "nope", "--keep-last", "1"), 3, b"nope")
    assert numbers(a, "vm1") == made


def test_a_pull_with_a_bandwidth_limit_completes_and_a_bad_limit_is_refused(
    two: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two
    block_volume(a, tmp_path, "vm1", 8 * MiB, os.urandom(2 * MiB))
    n = write_block(a, "vm1", [(4 * MiB, os.urandom(MiB))])
    refused(cli(b, "pull", str(a), "vm1", "--bwlimit", "fast"), 2, b"invalid rate")
    assert query(b, "SELECT name FROM volumes") == []
    moved = pull(b, str(a), "vm1", "--bwlimit", "64M")
    assert (moved["n"], moved["plan"]) == (n, "new")
    assert exported(a, f"vm1@{n}", tmp_path / "a.img") == exported(b, f"vm1@{n}", tmp_path / "b.img")
