"""Old stores stay readable: stores of every older catalog format, made by the casfs of
their time (tests/data/stores, README there), open with today's casfs, migrated once
however many processes open them at the same moment, with every image, volume and
snapshot there and holding what it held, the overlays killed mounts left (a directory
volume's; from format 6 a block volume's, as overlay_chunks rows) folded into the next
snapshot, and fsck clean. A store of the current format, where one is here (made before
a format change, for its migration), opens the same way."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import sqlite3
import struct
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from casfs import catalog
from casfs.catalog import schema
from casfs.catalog.migrate import MIGRATIONS
from casfs.errors import UnsupportedFormat
from casfs.ids import ROOT_INO
from casfs.lifecycle.phases import ImagePhase, VolumePhase
from casfs.lifecycle.pids import alive
from casfs.repo import Repository
from casfs.vfs.volume import open_volume
from tests.helpers import blobs as blob_files
from tests.helpers.cli import CLI, env, js, ok
from tests.helpers.fsck import assert_consistent, query
from tests.helpers.mount import cleanup, start_daemon, unmount, wait_gone
from tests.helpers.volumes import names

DATA = Path(__file__).parent.parent / "data" / "stores"
_spec = importlib.util.spec_from_file_location("make_store", DATA / "make_store.py")
assert _spec is not None and _spec.loader is not None
make_store = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_store)

FORMATS = list(range(1, catalog.FORMAT_VERSION))
STORES = sorted(int(p.name.split("-")[1].split(".")[0]) for p in DATA.glob("format-*.tar.gz"))
# A pid no process can have (above any pid_max): a dead daemon's, wherever this runs.
DEAD_PID = 2**31 - 1


def unpack(version: int, into: Path) -> tuple[Path, dict[str, Any]]:
    """The store of `version` (its dead daemon's pid made surely dead) and what it held."""
    with tarfile.open(DATA / f"format-{version}.tar.gz") as tar:
        tar.extractall(into, filter="data")
    store = into / "store"
    with sqlite3.connect(store / "catalog.db") as conn:
        for name, pid in conn.execute("SELECT name, owner_pid FROM volumes WHERE owner_pid IS NOT NULL"):
            if alive(pid):  # the pid of the daemon killed when the store was made is taken here
                conn.execute("UPDATE volumes SET owner_pid = ? WHERE name = ?", (DEAD_PID, name))
    conn.close()
    return store, json.loads((into / "expected.json").read_text())


def exported(store: Path, noun: str, name: str, dest: Path) -> Any:
    ok(store, noun, "export", name, str(dest))
    return make_store.manifest(dest)


def format_of(store: Path) -> int:
    return int(query(store, "SELECT value FROM meta WHERE key = 'format_version'")[0][0])


@pytest.mark.parametrize("version", STORES)
def test_an_old_store_opens_with_nothing_lost(tmp_path: Path, version: int) -> None:
    store, expected = unpack(version, tmp_path / "unpacked")
    assert format_of(store) == expected["format"] == version
    block = expected.get("block_overlay") or {}
    if block and block.get("form", "rows") == "rows":  # the old form: chunks 0, 1, 2 as overlay_chunks rows
        rows = "SELECT n FROM overlay_chunks WHERE volume = ? ORDER BY n"
        assert query(store, rows, block["volume"]) == [(0,), (1,), (2,)]
    elif block:  # format 7: an upper file, not yet folded
        assert len(query(store, "SELECT epoch FROM uppers WHERE volume = ?", block["volume"])) == 1
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
    errs = [p.communicate(timeout=60)[1] for p in procs]  # (all waited for before any assert)
    assert [p.returncode for p in procs] == [0] * 4, errs
    assert format_of(store) == catalog.FORMAT_VERSION

    images = {i["name"]: i for i in js(store, "image", "ls")}
    assert set(images) == set(expected["images"])
    assert {i["phase"] for i in images.values()} == {"ready"}
    volumes = {v["name"]: v for v in js(store, "volume", "ls")}
    assert set(volumes) == set(expected["volumes"])
    assert {v["phase"] for v in volumes.values()} == {"ready"}  # the killed mount's is recovered
    snapshots = {f"{name}@{n}" for name, v in volumes.items() for n in v["snapshots"]}
    assert snapshots == set(expected["snapshots"])

    out = tmp_path / "export"
    out.mkdir()
    overlay = expected.get("overlay") or {}
    for noun, table in (("image", "images"), ("snapshot", "snapshots"), ("volume", "volumes")):
        for name, manifest in expected[table].items():
            if manifest is None:
                continue
            got = exported(store, noun, name, out / f"{noun}-{name}")
            if (noun, name) == ("volume", overlay.get("volume")):
                # What the killed mount had saved is folded in first (a new snapshot).
                assert got.pop(overlay["file"])[2] == overlay["sha256"]
                assert got.pop("newdir")[0] == "dir"
                assert len(js(store, "snapshot", "ls", name)) == len(volumes[name]["snapshots"]) + 1
            if (noun, name) == ("volume", block.get("volume")):
                # So is a block volume's old-form overlay (overlay_chunks rows): the volume
                # and its new snapshot read as the disk before it with the writes made.
                snaps = js(store, "snapshot", "ls", name)
                assert len(snaps) == len(volumes[name]["snapshots"]) + 1
                new = f"{name}@{max(s['n'] for s in snaps)}"
                exported(store, "snapshot", new, out / new)
                _holds_block_writes(out / f"{noun}-{name}", block)
                _holds_block_writes(out / new, block)
                continue
            assert got == manifest, (noun, name)
    ok(store, "volume", "create", "fresh", "--from", f"{next(iter(sorted(snapshots)))}", "--grace", "1h")
    assert_consistent(store)
    assert _shape(store) == _shape(_fresh(tmp_path / "fresh"))
    # The old store's blob files stay where they are and are read there (the exports
    # above); what was written since (the killed mounts' folds) went into packs.
    assert (store / "blobs").is_dir() == (version < 9)
    # Format 10: the first command counted every figure once (the meta key is gone),
    # fsck (above) found them equal to a full recount, a listing settles what the
    # folds since left pending, and gc counts the rest.
    assert query(store, "SELECT value FROM meta WHERE key = 'figures.recount'") == []
    for v in js(store, "volume", "ls"):
        assert v["pending"] == [] and v["stored"] > 0 and 0 <= v["unique"] <= v["stored"], v
    ok(store, "gc")
    assert query(store, "SELECT COUNT(*) FROM figures WHERE pending != 0") == [(0,)]
    assert_consistent(store)
    if overlay:
        assert blob_files.indexed_packs(store) and blob_files.pack_files(store) == blob_files.indexed_packs(
            store
        )


@pytest.mark.parametrize("end", ["unmount", "kill"])
@pytest.mark.parametrize("version", [v for v in STORES if v >= 6])
def test_a_new_mount_writes_over_a_block_volumes_old_form_overlay(
    tmp_path: Path, version: int, end: str
) -> None:
    """A read/write mount of the upgraded store's `vraw`, its old-form overlay not yet
    folded (no export first), reads the writes the killed mount made and writes over
    part of them and beside them. Whether it is unmounted or killed after an fsync, the
    volume and its newest snapshot then hold the old writes with the new ones over them,
    vraw@1 holds what it held, and fsck is clean."""
    store, expected = unpack(version, tmp_path / "unpacked")
    block = expected["block_overlay"]
    name = block["volume"]
    chunk = make_store.CHUNK
    # Over the old write across chunks 0-1; inside the old whole chunk 2; on chunk 3's base.
    new_writes = [(chunk - 2048, b"\x5a" * 4096), (2 * chunk + 100, b"\xa5" * 512), (3 * chunk + 7, b"x" * 9)]
    disk_file = tmp_path / f"{name}.img"
    disk_file.touch()
    m = start_daemon(store, disk_file, volume=name)
    try:
        fd = os.open(disk_file, os.O_RDWR)
        try:
            before = os.pread(fd, block["size"] + 1, 0)
            assert hashlib.sha256(before).hexdigest() == block["sha256"]  # the old overlay is read
            disk = bytearray(before)
            for offset, data in new_writes:
                assert os.pwrite(fd, data, offset) == len(data)
                disk[offset : offset + len(data)] = data
            os.fsync(fd)
            assert os.pread(fd, block["size"], 0) == disk
        finally:
            os.close(fd)
        if end == "unmount":
            unmount(m)
        else:
            os.kill(m.pid, signal.SIGKILL)
            assert wait_gone(m.pid, m.proc, 30)
    finally:
        cleanup(m.path, m.pid, m.proc)
    out = tmp_path / "export"
    out.mkdir()
    ok(store, "volume", "export", name, str(out / name))
    assert (out / name).read_bytes() == disk
    last = max(s["n"] for s in js(store, "snapshot", "ls", name))
    ok(store, "snapshot", "export", f"{name}@{last}", str(out / "last"))
    assert (out / "last").read_bytes() == disk
    assert exported(store, "snapshot", f"{name}@1", out / "first") == expected["snapshots"][f"{name}@1"]
    assert_consistent(store)


def _holds_block_writes(path: Path, block: dict[str, Any]) -> None:
    """The exported disk holds each write the killed block mount made, and is the disk
    before them with those written (its whole digest, made by the old code: nothing else
    changed)."""
    disk = path.read_bytes()
    assert len(disk) == block["size"], path
    for offset, length, digest in block["writes"]:
        assert hashlib.sha256(disk[offset : offset + length]).hexdigest() == digest, (path, offset, length)
    assert hashlib.sha256(disk).hexdigest() == block["sha256"], path


def _fresh(path: Path) -> Path:
    Repository.init(path).close()
    return path


def _shape(store: Path) -> dict[str, Any]:
    """Every table's columns (name, type, not null, default, key) and every index."""
    with sqlite3.connect(store / "catalog.db") as conn:
        tables = [
            t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        ]
        shape: dict[str, Any] = {t: [r[1:] for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}
        shape["indexes"] = conn.execute(
            "SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL ORDER BY name"
        ).fetchall()
    conn.close()
    return shape


def test_the_phase_enums_are_the_phases_the_catalog_checks() -> None:
    assert tuple(ImagePhase) == schema.IMAGE_PHASES
    assert tuple(VolumePhase) == schema.VOLUME_PHASES
    assert set(MIGRATIONS) == set(FORMATS)
    assert set(FORMATS) <= set(STORES) <= {*FORMATS, catalog.FORMAT_VERSION}  # a store of each


@pytest.mark.parametrize("version", [None, 5])
def test_an_unknown_phase_is_refused(tmp_path: Path, version: int | None) -> None:
    """New stores and migrated ones check every phase (a typo cannot reach the disk)."""
    store = _fresh(tmp_path / "fresh") if version is None else unpack(version, tmp_path / "old")[0]
    repo = Repository.open(store)
    try:
        conn = repo.conn
        ok(store, "volume", "create", "x", "--blank-dir")
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("UPDATE volumes SET phase = 'mountde' WHERE name = 'x'")
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute(
                "INSERT INTO images (name, kind, phase, chunk_size, created) "
                "VALUES ('i', 'dir', 'redy', 4096, 0)"
            )
    finally:
        repo.close()


def test_a_phase_from_nowhere_stops_the_migration_and_changes_nothing(tmp_path: Path) -> None:
    store, _ = unpack(5, tmp_path / "old")
    with sqlite3.connect(store / "catalog.db") as conn:
        conn.execute("UPDATE volumes SET phase = 'frozen' WHERE name = 'vraw'")
    conn.close()
    with pytest.raises(UnsupportedFormat, match="frozen"):
        Repository.open(store)
    assert format_of(store) == 5
    assert query(store, "SELECT phase FROM volumes WHERE name = 'vraw'") == [("frozen",)]


def test_a_killed_mounts_listing_keeps_its_cookies_through_the_upgrade_to_entry_rows(tmp_path: Path) -> None:
    """Format 5 moved a copied-up directory's entries out of its overlay row: the real
    format-4 store, whose mount was killed after writing to its root, keeps the root's
    names with their readdir cookies, and the next name gets the next cookie."""
    store, expected = unpack(4, tmp_path / "old")
    (blob,) = query(store, "SELECT listing FROM overlay_inodes WHERE volume = 'vdir' AND ino = 1")[0]
    raw, head, old = bytes(blob), struct.Struct("<QQH"), {}
    pos = 8
    while pos < len(raw):
        cookie, _, n = head.unpack_from(raw, pos)
        old[raw[pos + head.size : pos + head.size + n]] = cookie
        pos += head.size + n
    assert expected["overlay"]["file"].encode() in old and b"newdir" in old
    repo = Repository.open(store)
    try:
        view = open_volume(repo, "vdir")
        assert {name: cookie for name, _, cookie in view.readdir(ROOT_INO, 0)} == old
        names(view).mknod(ROOT_INO, b"c", 0o100644, 0, 0, 0)
        listing = view.nodes[ROOT_INO].listing
        assert listing is not None and listing.entries[b"c"][0] == struct.unpack_from("<Q", raw)[0]
        view.flush_sync()
        assert b"c" in {name for name, _, _ in open_volume(repo, "vdir").readdir(ROOT_INO, 0)}
    finally:
        repo.close()
    ok(store, "snapshot", "create", "vdir")
    assert_consistent(store)


@pytest.mark.parametrize("version", [v for v in STORES if 2 <= v < 8])
def test_a_new_mount_writes_over_a_directory_volumes_old_form_overlay(tmp_path: Path, version: int) -> None:
    """A read/write mount of the upgraded store's `vdir`, its old-form overlay not yet
    folded (the file the killed mount wrote is an overlay_chunks row), appends to that
    file and fsyncs, and is killed. The file then lives in an upper file: its chunk rows
    are gone from the catalog (the flush cut them, with the refcounts), the volume reads
    the old bytes and the new, and fsck is clean."""
    store, expected = unpack(version, tmp_path / "unpacked")
    overlay = expected["overlay"]
    name, file = overlay["volume"], overlay["file"]
    rows = "SELECT count(*) FROM overlay_chunks WHERE volume = ?"
    assert query(store, rows, name) == [(1,)]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    m = start_daemon(store, mnt, volume=name)
    try:
        old = (mnt / file).read_bytes()
        assert hashlib.sha256(old).hexdigest() == overlay["sha256"]
        with open(mnt / file, "ab") as f:
            f.write(b"appended after the upgrade\n")
            f.flush()
            os.fsync(f.fileno())
        os.kill(m.pid, signal.SIGKILL)
        assert wait_gone(m.pid, m.proc, 30)
    finally:
        cleanup(m.path, m.pid, m.proc)
    assert query(store, rows, name) == [(0,)]
    out = tmp_path / "export"
    ok(store, "volume", "export", name, str(out))
    assert (out / file).read_bytes() == old + b"appended after the upgrade\n"
    assert_consistent(store)
