"""Crash recovery: the CLI is killed (SIGKILL, by CASFS_FAULT) in the middle of an
import, a snapshot, a create and a delete; the next command, whatever it is, recovers,
says so on stderr, and leaves the store consistent (fsck clean, no orphan blob files,
nothing staged)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from casfs.ids import ROOT_INO
from casfs.repo import Repository
from casfs.vfs.volume import open_volume
from tests.helpers.blobs import blob_ids
from tests.helpers.cli import casfs, js, killed_at, ok, recovered
from tests.helpers.fsck import assert_consistent, query, tmp_files
from tests.helpers.volumes import names

CHUNK = 64 << 10


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    path = tmp_path / "disk.raw"
    path.write_bytes(os.urandom(24 * CHUNK) + bytes(8 * CHUNK) + os.urandom(1000))
    return path


@pytest.mark.parametrize("point", ["import:after-claim", "import:after-stage", "import:after-publish"])
def test_killed_import_is_rolled_back(store: Path, raw: Path, point: str) -> None:
    ok(store, "image", "import", "base", str(raw))
    files_before = blob_ids(store)
    other = raw.with_name("other.raw")
    other.write_bytes(os.urandom(16 * CHUNK))

    killed_at(store, point, "image", "import", "new", str(other))
    (row,) = query(store, "SELECT phase, owner_pid FROM images WHERE name = 'new'")
    assert row[0] == ("queued" if point == "import:after-claim" else "verifying")  # a raw file is hashed
    if point == "import:after-stage":
        assert tmp_files(store), "the import had staged blobs"
    if point == "import:after-publish":
        assert blob_ids(store) - files_before, "the import had published blob files"

    p = ok(store, "image", "ls")  # any command recovers
    assert any(f"image new: import by dead process {row[1]}" in m for m in recovered(p)), p.stderr
    assert query(store, "SELECT name FROM images ORDER BY name") == [("base",)]
    assert blob_ids(store) == files_before
    assert_consistent(store)
    # The name is free again, and the next command has nothing left to recover.
    p = ok(store, "image", "import", "new", str(other))
    assert recovered(p) == []
    assert js(store, "image", "info", "new")["phase"] == "ready"
    assert_consistent(store)


def test_killed_snapshot_keeps_the_overlay_and_is_redone(store: Path, tmp_path: Path) -> None:
    ok(store, "volume", "create", "v", "--blank-dir")
    # What a crashed daemon leaves: an overlay with a flushed file, the view never closed.
    repo = Repository.open(store)
    try:
        view = open_volume(repo, "v")
        ino = names(view).mknod(ROOT_INO, b"f", 0o100644, 0, 0, 0).ino
        view.write_sync(ino, 0, b"data")
        view.flush_sync()
    finally:
        repo.close()
    overlay = query(store, "SELECT COUNT(*) FROM overlay_inodes WHERE volume = 'v'")

    killed_at(store, "snapshot:after-phase", "snapshot", "create", "v")
    assert query(store, "SELECT phase FROM volumes WHERE name = 'v'") == [("snapshotting",)]

    p = ok(store, "volume", "info", "v", "--json")
    assert any(m.startswith("volume v: snapshotting by dead process") for m in recovered(p)), p.stderr
    assert query(store, "SELECT phase, owner_pid FROM volumes WHERE name = 'v'") == [("ready", None)]
    assert query(store, "SELECT COUNT(*) FROM overlay_inodes WHERE volume = 'v'") == overlay
    assert_consistent(store)

    assert ok(store, "snapshot", "create", "v").stdout.strip() == "1"
    assert query(store, "SELECT COUNT(*) FROM overlay_inodes WHERE volume = 'v'") == [(0,)]
    ok(store, "snapshot", "export", "v@1", str(tmp_path / "out"))
    assert (tmp_path / "out" / "f").read_bytes() == b"data"
    assert_consistent(store)


def test_killed_delete_is_finished(store: Path, raw: Path) -> None:
    ok(store, "image", "import", "base", str(raw))
    files_before = blob_ids(store)
    ok(store, "volume", "create", "v", "--blank-block", "1M")
    ok(store, "snapshot", "create", "v")

    killed_at(store, "delete:after-phase", "volume", "rm", "v")
    assert query(store, "SELECT phase FROM volumes WHERE name = 'v'") == [("deleting",)]
    # A deleting volume cannot be cloned or snapshotted meanwhile (its deleter is dead,
    # but these commands recover first: the delete is finished and v is gone).
    p = casfs(store, "volume", "create", "w", "--from", "v@1")
    assert p.returncode == 3, p.stderr
    assert any(m.startswith("volume v: deleting by dead process") for m in recovered(p)), p.stderr
    assert js(store, "volume", "ls") == []
    assert query(store, "SELECT COUNT(*) FROM snapshots") == [(0,)]
    ok(store, "gc")
    assert blob_ids(store) == files_before
    assert_consistent(store)


def test_killed_blank_create_is_rolled_back(store: Path) -> None:
    killed_at(store, "create:after-claim", "volume", "create", "v", "--blank-block", "10G")
    assert query(store, "SELECT phase FROM volumes WHERE name = 'v'") == [("creating",)]
    p = ok(store, "volume", "ls", "--json")
    assert any(m.startswith("volume v: creating by dead process") for m in recovered(p)), p.stderr
    assert query(store, "SELECT COUNT(*) FROM volumes") == [(0,)]
    ok(store, "volume", "create", "v", "--blank-block", "10G")
    assert_consistent(store)


def test_mount_of_a_dead_daemon_is_released(store: Path) -> None:
    ok(store, "volume", "create", "v", "--blank-dir")
    # The row a daemon killed while mounting read/write leaves: phase mounted, its pid.
    dead = subprocess.Popen(["true"])
    dead.wait()
    conn = sqlite3.connect(store / "catalog.db")
    with conn:
        conn.execute("UPDATE volumes SET phase = 'mounted', owner_pid = ? WHERE name = 'v'", (dead.pid,))
    conn.close()
    p = ok(store, "volume", "ls")
    assert recovered(p) == [
        f"volume v: mounted by dead process {dead.pid}: mount ended, its overlay is kept "
        "for the next mount or snapshot"
    ]
    assert js(store, "volume", "info", "v")["phase"] == "ready"
    assert_consistent(store)
