"""The `casfs` program leaves its catalog's WAL to the process's end (cli.run,
cli.store.WAL_KEEP_BYTES): a command's commit is synced into the WAL, and catalog.db
is not rewritten at each exit. What a clone commits survives the program ending at
once (os._exit), a SIGKILL right after the commit, and the loss of all but the files
SQLite syncs: catalog.db and its WAL, as after a power cut (the -shm index is shared
memory, rebuilt from the WAL)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from casfs.cli.store import WAL_KEEP_BYTES
from casfs.repo import Repository
from tests.helpers.cli import js, killed_at, ok
from tests.helpers.fsck import assert_consistent


@pytest.fixture
def image(store: Path, tmp_path: Path) -> str:
    raw = tmp_path / "disk.raw"
    raw.write_bytes(os.urandom(256 << 10))
    ok(store, "image", "import", "img", raw)
    Repository.open(store).close()  # (the library checkpoints: catalog.db has the import)
    return "img"


def _wal(store: Path) -> Path:
    return store / "catalog.db-wal"


def _volumes(db: Path) -> list[str]:
    """The volumes catalog.db has without its WAL (a copy of the file alone)."""
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM volumes ORDER BY name")]
    finally:
        conn.close()


def _power_cut(store: Path, to: Path) -> Path:
    """A copy of the store without catalog.db-shm: what the disk keeps."""
    shutil.copytree(store, to, ignore=shutil.ignore_patterns("catalog.db-shm"))
    return to


def test_a_clone_is_committed_to_the_wal_and_survives_a_power_cut(
    store: Path, image: str, tmp_path: Path
) -> None:
    assert not _wal(store).exists()
    ok(store, "volume", "create", "c", "--from", image)
    assert _wal(store).stat().st_size > 0, "the program checkpointed its WAL"
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(store / "catalog.db", alone / "catalog.db")
    assert _volumes(alone / "catalog.db") == [], "the clone is in catalog.db: this test tests nothing"

    after = _power_cut(store, tmp_path / "after")
    assert js(after, "volume", "info", "c")["origin"] == "image:img"
    assert_consistent(after)
    assert js(store, "volume", "info", "c")["phase"] == "ready"


def test_a_clone_killed_right_after_its_commit_is_there(store: Path, image: str, tmp_path: Path) -> None:
    killed_at(store, "create:after-commit", "volume", "create", "c", "--from", image)
    after = _power_cut(store, tmp_path / "after")
    for s in (store, after):
        assert js(s, "volume", "info", "c")["phase"] == "ready"
        assert_consistent(s)
    ok(store, "volume", "create", "c", "--from", image)  # (a repeat: the same spec, nothing done)


def test_many_short_commands_keep_the_wal_small(store: Path, image: str) -> None:
    for i in range(6):
        ok(store, "volume", "create", f"c{i}", "--from", image)
    ok(store, "volume", "rm", "c0")
    assert 0 < _wal(store).stat().st_size < WAL_KEEP_BYTES
    assert sorted(v["name"] for v in js(store, "volume", "ls")) == [f"c{i}" for i in range(1, 6)]


def test_a_big_wal_is_checkpointed_by_the_next_command(store: Path) -> None:
    # A process that commits more than WAL_KEEP_BYTES and ends without closing.
    grow = (
        "import os, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA synchronous = FULL')\n"
        "c.execute('INSERT INTO meta VALUES (?, ?)', ('test.padding', 'x' * int(sys.argv[2])))\n"
        "c.execute('DELETE FROM meta WHERE key = ?', ('test.padding',))\n"
        "os._exit(0)\n"
    )
    subprocess.run(
        [sys.executable, "-c", grow, str(store / "catalog.db"), str(WAL_KEEP_BYTES)], check=True, timeout=60
    )
    assert _wal(store).stat().st_size > WAL_KEEP_BYTES
    ok(store, "volume", "ls")
    assert not _wal(store).exists(), "a big WAL was left for the next command to read back"
