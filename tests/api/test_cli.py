"""The `casfs` command line, run for real (`python -m casfs`) against stores in tmp dirs.

Every failing command must exit with its documented code, say what and why in one
stderr line, and leave the store exactly as it was (blob rows and blob files). Every
store is checked with fsck when its test ends (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from casfs import images, volumes
from casfs.kinds import VolumeKind
from casfs.repo import Repository
from tests.helpers.blobs import stored_files
from tests.helpers.cli import CLI, TIMEOUT, casfs, env, fails, js, out
from tests.helpers.fsck import Stores, query

CHUNK = VolumeKind.BLOCK.default_chunk_size  # (a raw import's, as the CLI gives none)


def state(store: Path) -> tuple[list[tuple[Any, ...]], list[str]]:
    """The blob rows, the blobs stored and the staging area: what a failed command must not change."""
    rows = query(store, "SELECT id, kind, refs, size, stored FROM blobs ORDER BY id")
    return rows, stored_files(store)


def stored_total(store: Path) -> int:
    return int(query(store, "SELECT COALESCE(SUM(stored), 0) FROM blobs")[0][0])


def make_raw(path: Path, seed: bytes = b"") -> Path:
    """Random chunks, a run of zeros (holes), and a partial last chunk."""
    data = os.urandom(16 * CHUNK) + bytes(32 * CHUNK) + os.urandom(8 * CHUNK + 1000)
    path.write_bytes(data)
    return path


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    return make_raw(tmp_path / "disk.img")


def test_init_is_idempotent_and_refuses_a_foreign_dir(tmp_path: Path, stores: Stores) -> None:
    s = stores.add(tmp_path / "s")
    assert "created" in out(s, "init")
    assert "already exists" in out(s, "init")
    other = tmp_path / "other"
    other.mkdir()
    (other / "file").write_text("x")
    assert "not a casfs store" in fails(other, 2, "init")


def test_raw_import_export_round_trip(store: Path, raw: Path, tmp_path: Path) -> None:
    p = casfs(store, "image", "import", "disk", str(raw))
    assert p.returncode == 0 and p.stderr == ""  # no progress when stderr is not a TTY
    assert p.stdout.startswith("imported image disk: ") and "(block)" in p.stdout
    b3 = json.loads(out(store, "image", "info", "disk", "--json"))["digest"]
    assert b3.startswith("blake3:") and b3 in p.stdout
    exported = tmp_path / "out.img"
    out(store, "image", "export", "disk", str(exported))
    assert filecmp.cmp(raw, exported, shallow=False)
    # DEST exists: a conflict, and the file is left alone.
    assert "already exists" in fails(store, 4, "image", "export", "disk", str(exported))
    assert filecmp.cmp(raw, exported, shallow=False)


def test_ls_and_info_json(store: Path, raw: Path) -> None:
    sha = hashlib.sha256(raw.read_bytes()).hexdigest()
    out(store, "image", "import", "disk", str(raw), "--expect", f"sha256:{sha}")
    [img] = js(store, "image", "ls")
    info = js(store, "image", "info", "disk")
    assert img == info
    assert (info["name"], info["kind"], info["phase"]) == ("disk", "block", "ready")
    assert info["size"] == info["logical"] == raw.stat().st_size
    # 25 random chunks (the last one partial) are stored; 32 zero chunks are holes.
    assert 24 * CHUNK < info["stored"] < 25 * CHUNK + 8192
    assert info["unique"] == info["stored"] == stored_total(store)
    assert info["volumes"] == [] and info["chunk_size"] == CHUNK
    text = out(store, "image", "ls").splitlines()
    assert text[0].split() == ["NAME", "KIND", "PHASE", "SIZE", "STORED", "UNIQUE", "RATIO", "VOLUMES"]
    assert text[1].split()[:3] == ["disk", "block", "ready"]
    assert "size:" in out(store, "image", "info", "disk")

    out(store, "volume", "create", "vm", "--from", "disk")
    info = js(store, "image", "info", "disk")
    assert info["volumes"] == ["vm"] and info["unique"] == 0  # now shared with the volume
    vol = js(store, "volume", "info", "vm")
    assert (vol["kind"], vol["mode"], vol["phase"], vol["origin"]) == ("block", "rw", "ready", "image:disk")
    assert vol["size"] == raw.stat().st_size and vol["stored"] == info["stored"] and vol["snapshots"] == []
    assert out(store, "snapshot", "create", "vm", "--label", "first").strip() == "1"
    vol = js(store, "volume", "info", "vm")
    assert vol["snapshots"] == [1] and vol["logical"] == 2 * vol["size"]
    [snap] = js(store, "snapshot", "ls", "vm")
    assert (snap["volume"], snap["n"], snap["label"], snap["unique"]) == ("vm", 1, "first", 0)


def test_volume_sources(store: Path, raw: Path) -> None:
    out(store, "image", "import", "disk", str(raw))
    out(store, "volume", "create", "a", "--from", "disk")
    assert out(store, "snapshot", "create", "a").strip() == "1"
    out(store, "volume", "create", "b", "--from", "a@1", "--ro")
    out(store, "volume", "create", "d", "--blank-dir")
    out(store, "volume", "create", "k", "--blank-block", "64M")
    vols = {v["name"]: v for v in js(store, "volume", "ls")}
    got = {n: (v["kind"], v["mode"], v["origin"], v["size"]) for n, v in vols.items()}
    size = raw.stat().st_size
    assert got == {
        "a": ("block", "rw", "image:disk", size),
        "b": ("block", "ro", "snapshot:a@1", size),
        "d": ("dir", "rw", "blank", 0),
        "k": ("block", "rw", "blank", 64 << 20),
    }
    assert vols["a"]["base"] == vols["b"]["base"] == js(store, "snapshot", "ls", "a")[0]["root"]
    assert vols["k"]["stored"] < 4096 and vols["k"]["unique"] == vols["k"]["stored"]  # holes only
    header = out(store, "volume", "ls").splitlines()[0].split()
    assert header[:3] == ["NAME", "KIND", "MODE"] and "SNAPSHOTS" in header and "ORIGIN" in header

    # The snapshot a volume was made from, and its volume, cannot go.
    assert "b" in fails(store, 4, "snapshot", "rm", "a@1")
    assert "b" in fails(store, 4, "volume", "rm", "a")
    out(store, "volume", "rm", "b")
    out(store, "snapshot", "rm", "a@1")
    assert "no snapshot" in out(store, "snapshot", "rm", "a@1", "--if-exists")
    assert js(store, "snapshot", "ls", "a") == []


def test_repeat_create_is_idempotent_and_a_different_one_conflicts(store: Path, raw: Path) -> None:
    out(store, "image", "import", "disk", str(raw))
    out(store, "volume", "create", "v", "--from", "disk")
    before = state(store)
    assert "already exists with the same spec" in out(store, "volume", "create", "v", "--from", "disk")
    assert "already imported" in out(store, "image", "import", "disk", str(raw))
    assert "different spec" in fails(store, 4, "volume", "create", "v", "--from", "disk", "--ro")
    assert "different spec" in fails(store, 4, "volume", "create", "v", "--blank-block", "1G")
    assert state(store) == before


def test_rollback(store: Path, raw: Path) -> None:
    out(store, "image", "import", "disk", str(raw))
    out(store, "volume", "create", "v", "--from", "disk")
    out(store, "snapshot", "create", "v")
    out(store, "snapshot", "create", "v")
    assert "snapshot 1" in out(store, "rollback", "v", "1")
    vol = js(store, "volume", "info", "v")
    assert vol["base"] == js(store, "snapshot", "ls", "v")[0]["root"] and vol["snapshots"] == [1, 2]
    before = state(store)
    assert "no snapshot v@7" in fails(store, 3, "rollback", "v", "7")
    fails(store, 2, "rollback", "v", "zero")
    fails(store, 3, "rollback", "nope", "1")
    assert state(store) == before


def test_export_volume_and_snapshot(store: Path, raw: Path, tmp_path: Path) -> None:
    out(store, "image", "import", "disk", str(raw))
    out(store, "volume", "create", "v", "--from", "disk")
    out(store, "snapshot", "create", "v")
    out(store, "volume", "export", "v", str(tmp_path / "v.img"))
    out(store, "snapshot", "export", "v@1", str(tmp_path / "s.img"))
    assert filecmp.cmp(raw, tmp_path / "v.img", shallow=False)
    assert filecmp.cmp(raw, tmp_path / "s.img", shallow=False)
    fails(store, 3, "snapshot", "export", "v@2", str(tmp_path / "t.img"))
    assert not (tmp_path / "t.img").exists()


def test_rm_then_gc_frees_exactly_the_unique_bytes(store: Path, raw: Path, tmp_path: Path) -> None:
    out(store, "image", "import", "keep", str(raw))
    other = make_raw(tmp_path / "other.img")
    out(store, "image", "import", "gone", str(other))
    unique = js(store, "image", "info", "gone")["unique"]
    total = stored_total(store)
    assert 0 < unique < total
    out(store, "image", "rm", "gone")
    assert "no image gone" in out(store, "image", "rm", "gone", "--if-exists")
    report = js(store, "gc")
    assert report["bytes_freed"] == unique and report["problems"] == []
    assert stored_total(store) == total - unique


# -- bad input: exit code, one line, store unchanged ---------------------------


@pytest.fixture
def used(store: Path, raw: Path) -> Path:
    """A store with image 'disk' and volume 'vm' made from it."""
    out(store, "image", "import", "disk", str(raw))
    out(store, "volume", "create", "vm", "--from", "disk")
    return store


def test_wrong_digest_stores_nothing(used: Path, tmp_path: Path) -> None:
    other = make_raw(tmp_path / "other.img")
    actual = hashlib.sha256(other.read_bytes()).hexdigest()
    wrong = "ab" * 32
    before = state(used)
    msg = fails(used, 5, "image", "import", "new", str(other), "--expect", f"sha256:{wrong}")
    assert f"sha256:{wrong}" in msg and f"sha256:{actual}" in msg
    assert state(used) == before
    assert [i["name"] for i in js(used, "image", "ls")] == ["disk"]


@pytest.mark.parametrize(
    ("code", "args", "says"),
    [
        (3, ["image", "import", "new", "/nonexistent/disk.img"], "does not exist"),
        (4, ["image", "import", "disk", "OTHER"], "different source"),
        (4, ["image", "rm", "disk"], "vm"),
        (2, ["volume", "create", "v2", "--blank-block", "12Q"], "invalid size"),
        (2, ["volume", "create", "v2", "--blank-block", "0"], "invalid size"),
        (2, ["image", "import", "new", "RAW", "--chunk-size", "3K"], "chunk size"),
        (2, ["image", "import", "bad name", "RAW"], "invalid image name"),
        (2, ["volume", "create", "-x", "--blank-dir"], "arguments"),
        (2, ["volume", "create", "v2"], "--from"),
        (2, ["volume", "create", "v2", "--blank-dir", "--from", "disk"], "not allowed"),
        (2, ["image", "import", "new", "RAW", "--expect", "md5:00"], "invalid digest"),
        (2, ["fsck", "--sample", "2"], "invalid sample"),
        (2, ["image", "frobnicate"], "invalid choice"),
        (3, ["volume", "create", "v2", "--from", "vm@9"], "no snapshot vm@9"),
        (3, ["volume", "create", "v2", "--from", "nosuch"], "no image"),
        (3, ["snapshot", "rm", "vm@9"], "no snapshot vm@9"),
        (3, ["snapshot", "ls", "nosuch"], "no volume"),
        (3, ["volume", "info", "nosuch"], "no volume"),
        (3, ["image", "info", "nosuch"], "no image"),
        (2, ["snapshot", "rm", "vm@zero"], "invalid snapshot"),
    ],
)
def test_bad_input(used: Path, tmp_path: Path, raw: Path, code: int, args: list[str], says: str) -> None:
    other = make_raw(tmp_path / "other.img")
    args = [str(other) if a == "OTHER" else str(raw) if a == "RAW" else a for a in args]
    before = state(used)
    assert says in fails(used, code, *args)
    assert state(used) == before


def test_no_store_given(tmp_path: Path) -> None:
    assert "CASFS_STORE" in fails(None, 2, "image", "ls")
    assert "no casfs store" in fails(tmp_path / "nowhere", 3, "image", "ls")
    assert not (tmp_path / "nowhere").exists()


def test_store_of_unknown_format_is_refused(used: Path) -> None:
    sqlite = shutil.which("sqlite3")
    assert sqlite, "the sqlite3 CLI is needed (scripts/install.sh installs it)"
    before = state(used)
    db = str(used / "catalog.db")
    version = subprocess.run(
        [sqlite, db, "SELECT value FROM meta WHERE key = 'format_version'"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    subprocess.run([sqlite, db, "UPDATE meta SET value = '99' WHERE key = 'format_version'"], check=True)
    for args in (["image", "ls"], ["volume", "create", "x", "--blank-dir"], ["gc"]):
        msg = fails(used, 1, *args)
        assert "format 99" in msg and "upgrade casfs" in msg
    assert state(used) == before
    subprocess.run(
        [sqlite, db, f"UPDATE meta SET value = '{version}' WHERE key = 'format_version'"], check=True
    )


# -- dedup ---------------------------------------------------------------------


def test_same_file_twice_adds_no_blob(store: Path, raw: Path) -> None:
    out(store, "image", "import", "one", str(raw))
    before = state(store)
    assert "stored 0 B new" in out(store, "image", "import", "two", str(raw))
    assert state(store)[1] == before[1]
    assert js(store, "image", "info", "two")["unique"] == 0


def test_shared_chunks_are_stored_once(store: Path, tmp_path: Path) -> None:
    base = os.urandom(64 * CHUNK)
    a = tmp_path / "a.img"
    a.write_bytes(base)
    changed = bytearray(base)
    for n in (3, 30, 60):
        changed[n * CHUNK : (n + 1) * CHUNK] = os.urandom(CHUNK)
    b = tmp_path / "b.img"
    b.write_bytes(changed)
    out(store, "image", "import", "a", str(a))
    after_a = stored_total(store)
    out(store, "image", "import", "b", str(b))
    grew = stored_total(store) - after_a
    # Three new random chunks (stored raw: incompressible) and a new map root.
    assert 3 * CHUNK <= grew < 3 * CHUNK + 8192
    info = js(store, "image", "info", "b")
    assert info["unique"] == grew and info["stored"] >= 64 * CHUNK


# -- the terminal --------------------------------------------------------------


def test_progress_only_on_a_tty(store: Path, tmp_path: Path) -> None:
    big = tmp_path / "big.img"
    big.write_bytes(os.urandom(96 << 20))
    master, slave = pty.openpty()
    cmd = [*CLI, "-s", str(store), "image", "import", "big", str(big)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env=env()) as p:
        os.close(slave)
        seen = b""
        while True:
            try:
                part = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed its end
                break
            if not part:
                break
            seen += part
        os.close(master)
        assert p.wait(TIMEOUT) == 0
        assert p.stdout is not None and b"imported image big" in p.stdout.read()
    assert b"importing big: " in seen and b"MB/s" in seen


def test_help_everywhere() -> None:
    for args in (
        [],
        ["image"],
        ["image", "import"],
        ["image", "ls"],
        ["image", "export"],
        ["volume", "create"],
        ["volume", "export"],
        ["snapshot", "create"],
        ["snapshot", "rm"],
        ["rollback"],
        ["mount"],
        ["umount"],
        ["fsck"],
        ["gc"],
    ):
        p = casfs(None, *args, "--help")
        assert p.returncode == 0 and "usage: casfs" in p.stdout, args
    assert "--blank-block SIZE" in casfs(None, "volume", "create", "--help").stdout


def test_volume_info_shows_data_written_since_the_last_fold(store: Path) -> None:
    """Written data lives in the volume's upper files until a snapshot folds it into
    blobs: `volume info` says how much (for a store on S3: not yet uploaded)."""
    from casfs.repo import Repository
    from casfs.vfs.api import ROOT_INO
    from casfs.vfs.volume import open_volume

    out(store, "volume", "create", "k", "--blank-block", "16M")
    assert js(store, "volume", "info", "k")["local"] == 0
    with contextlib.closing(Repository.open(store)) as repo:
        v = open_volume(repo, "k")
        v.ensure_writable()
        v.write_sync(ROOT_INO, 0, os.urandom(1 << 20))
        v.close(snapshot=False)
    vol = js(store, "volume", "info", "k")
    assert vol["local"] >= 1 << 20 and vol["stored"] >= vol["local"]
    assert "written since the last fold, on this host only: not yet blobs" in out(
        store, "volume", "info", "k"
    )
    out(store, "snapshot", "create", "k")
    assert js(store, "volume", "info", "k")["local"] == 0
    assert "not yet blobs" not in out(store, "volume", "info", "k")


def test_import_says_what_it_stored_that_the_store_did_not_hold(store: Path, tmp_path: Path) -> None:
    """The import's "stored N new" (counted by the import itself) is the image's unique
    bytes right after it, also when part of the tree was already held."""
    from casfs.units import format_size

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (a / "shared").write_bytes(os.urandom(300_000))
    shutil.copytree(a, b)
    (b / "own").write_bytes(os.urandom(100_000))
    for name, tree in (("a", a), ("b", b)):
        said = out(store, "image", "import", name, str(tree))
        unique = js(store, "image", "info", name)["unique"]
        assert f"stored {format_size(unique)} new" in said, said
    assert 100_000 < js(store, "image", "info", "b")["unique"] < 200_000


def test_volume_export_works_once_the_settle_module_is_loaded(repo: Repository, tmp_path: Path) -> None:
    """`casfs.volumes.settle` is a module and was a function of the package's lazy face
    too: once the module was imported, the package's `settle` was the module, and an
    export (which settles a crashed mount's changes first) failed with "'module' object
    is not callable"."""
    (tmp_path / "raw").write_bytes(os.urandom(1 << 16))
    images.import_image(repo, "img", tmp_path / "raw")
    volumes.create_volume(repo, "v", volumes.Source(image="img"))
    code = (
        "import sys, casfs.volumes.settle; from casfs.cli import main; "
        f"sys.exit(main(['-s', {str(repo.path)!r}, 'volume', 'export', 'v', {str(tmp_path / 'out')!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out").read_bytes() == (tmp_path / "raw").read_bytes()
