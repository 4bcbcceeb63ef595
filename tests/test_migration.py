"""Old stores stay readable: stores of formats 1 to 4, built with the
schema text of their time, are migrated to the current format on open (once, however
many processes open them at the same moment) with their volumes and snapshots intact."""

from __future__ import annotations

import sqlite3
import stat
import struct
import subprocess
import time
from pathlib import Path

import pytest

from casfs import catalog
from casfs.repo import Repository
from casfs.snapshots.kinds import TREE
from casfs.vfs.volume import VolumeView
from casfs.volumes import _blank_tree
from tests.helpers.cli import CLI, env, js, ok
from tests.helpers.fsck import assert_consistent, query

SPEC = '{"blank_block": null, "blank_dir": true, "image": null, "mode": "rw", "snapshot": null}'


def old_store(path: Path, version: int) -> Path:
    """A store as casfs of format `version` made it: one blank directory volume `v` with
    snapshot 1 (its base and the snapshot share the root blob: refs 2)."""
    repo = Repository(path)
    path.mkdir()
    repo.blobs.create()
    repo.lock_path.touch()
    repo.conn.executescript(
        "BEGIN;"
        + "".join(catalog.SCHEMAS[:version])
        + f"INSERT INTO meta VALUES ('format_version', '{version}');"
        + f"INSERT INTO meta VALUES ('created', '{time.time()}');"
        + "COMMIT;"
    )
    try:
        with repo.batch() as batch:
            root = batch.put(_blank_tree(64 << 10), TREE)

            def rows(conn: sqlite3.Connection) -> None:
                conn.execute(
                    "INSERT INTO volumes (name, kind, mode, phase, base, origin, size, chunk_size, "
                    "next_ino, next_snapshot, spec, created) "
                    "VALUES ('v', 'dir', 'rw', 'ready', ?, 'blank', 0, 65536, 2, 2, ?, ?)",
                    (root, SPEC, time.time()),
                )
                conn.execute(
                    "INSERT INTO snapshots (volume, n, root, size, next_ino, label, created) "
                    "VALUES ('v', 1, ?, 0, 2, 'old', ?)",
                    (root, time.time()),
                )

            batch.commit({root: 2}, then=rows)
    finally:
        repo.close()
    return path


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_old_store_is_migrated_with_its_volumes(tmp_path: Path, version: int) -> None:
    store = old_store(tmp_path / "store", version)
    assert query(store, "SELECT value FROM meta WHERE key = 'format_version'") == [(str(version),)]
    # Four processes open it at once: one migrates, the others find it done.
    procs = [
        subprocess.Popen(
            [*CLI, "-s", str(store), "volume", "ls"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env(),
        )
        for _ in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    assert query(store, "SELECT value FROM meta WHERE key = 'format_version'") == [
        (str(catalog.FORMAT_VERSION),)
    ]

    (v,) = js(store, "volume", "ls")
    assert (v["name"], v["kind"], v["phase"], v["snapshots"], v["grace_s"], v["last_used"]) == (
        "v",
        "dir",
        "ready",
        [1],
        None,
        None,
    )
    assert [s["label"] for s in js(store, "snapshot", "ls", "v")] == ["old"]
    assert "already exists with the same spec" in ok(store, "volume", "create", "v", "--blank-dir").stdout
    ok(store, "volume", "create", "w", "--from", "v@1", "--grace", "1h")
    ok(store, "snapshot", "create", "v")
    assert_consistent(store)


def test_a_fresh_store_has_every_step(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "store")
    try:
        cols = {r[1] for r in repo.conn.execute("PRAGMA table_info(volumes)")}
        assert {"grace_s", "last_used", "owner_pid"} <= cols
        assert catalog.format_version(repo.conn) == catalog.FORMAT_VERSION == len(catalog.SCHEMAS)
        assert set(catalog.MIGRATIONS) == set(range(1, catalog.FORMAT_VERSION))
    finally:
        repo.close()


def test_a_crashed_mounts_overlay_survives_the_upgrade_to_entry_rows(tmp_path: Path) -> None:
    """Format 5 moved a copied-up directory's entries out of its overlay row: a store of
    format 4 whose mount crashed, with a listing in the old blob form, keeps its names,
    readdir cookies and all, and folds them into the next snapshot."""
    store = old_store(tmp_path / "store", 4)
    mode_dir, mode_file = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o644
    names = {b"a": (3, 10), b"b": (5, 11)}  # name -> (cookie, ino)
    listing = struct.pack("<Q", 6) + b"".join(
        struct.pack("<QQH", cookie, ino, len(name)) + name for name, (cookie, ino) in names.items()
    )
    with sqlite3.connect(store / "catalog.db") as conn:
        base = conn.execute("SELECT base FROM volumes WHERE name = 'v'").fetchone()[0]
        row = "INSERT INTO overlay_inodes VALUES (" + ", ".join("?" * 17) + ")"
        conn.execute(row, ("v", 1, mode_dir, 0, 0, 0, 0, 1, 1, 1, 2, b"", base, 1 << 62, b"", 1, listing))
        for ino in (10, 11):
            file = ("v", ino, mode_file, 0, 0, 0, 0, 1, 1, 1, 1, b"", bytes(32), 1 << 62, b"", 1, None)
            conn.execute(row, file)
        conn.execute("UPDATE volumes SET next_ino = 12 WHERE name = 'v'")
    repo = Repository.open(store)
    try:
        view = VolumeView(repo, "v")
        assert [(name, cookie) for name, _, cookie in view.readdir(1, 0)] == [(b"a", 3), (b"b", 5)]
        c = view.mknod(1, b"c", mode_file, 0, 0, 0)
        assert view.nodes[1].listing is not None and view.nodes[1].listing.entries[b"c"][0] == 6
        view.flush_sync()
        assert sorted(n for n, _, _ in VolumeView(repo, "v").readdir(1, 0)) == [b"a", b"b", b"c"]
        assert c.ino == 12
    finally:
        repo.close()
    ok(store, "snapshot", "create", "v")
    assert_consistent(store)
