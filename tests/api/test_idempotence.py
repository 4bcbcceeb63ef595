"""Idempotence through the real CLI: a repeated create or import with the same spec
succeeds and changes nothing; a different spec exits 4; `rm --if-exists` of nothing
succeeds; a second caller of an operation in progress gets Busy (exit 4) naming the
process doing it, instead of re-entering it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from casfs.ids import ROOT_INO
from tests.helpers.blobs import blob_ids
from tests.helpers.cli import CLI, casfs, env, js, ok
from tests.helpers.fsck import assert_consistent, query
from tests.helpers.procs import wait_stopped
from tests.helpers.volumes import names

CHUNK = 64 << 10


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    path = tmp_path / "disk.raw"
    path.write_bytes(os.urandom(8 * CHUNK) + bytes(4 * CHUNK))
    return path


def snapshot_of(store: Path) -> tuple[object, ...]:
    """Everything a repeat must leave as it was."""
    return (
        query(store, "SELECT * FROM images ORDER BY name"),
        query(store, "SELECT * FROM volumes ORDER BY name"),
        query(store, "SELECT * FROM snapshots ORDER BY volume, n"),
        query(store, "SELECT * FROM blobs ORDER BY id"),
        blob_ids(store),
    )


def conflict(store: Path, *args: str) -> str:
    p = casfs(store, *args)
    assert p.returncode == 4, (args, p.stdout, p.stderr)
    (line,) = p.stderr.splitlines()
    return line


def test_repeated_import_and_create_change_nothing(store: Path, raw: Path) -> None:
    ok(store, "image", "import", "disk", str(raw), "--expect", "blake3:" + js_digest(raw))
    ok(store, "volume", "create", "vm", "--from", "disk")
    ok(store, "volume", "create", "scratch", "--blank-block", "1G", "--grace", "1h")
    ok(store, "snapshot", "create", "vm")
    ok(store, "volume", "create", "clone", "--from", "vm@1", "--ro")
    before = snapshot_of(store)

    again = ok(store, "image", "import", "disk", str(raw), "--expect", "blake3:" + js_digest(raw))
    assert "already imported" in again.stdout
    for args in (
        ["vm", "--from", "disk"],
        ["scratch", "--blank-block", "1G", "--grace", "1h"],
        ["clone", "--from", "vm@1", "--ro"],
    ):
        assert "already exists with the same spec" in ok(store, "volume", "create", *args).stdout
    assert snapshot_of(store) == before
    assert_consistent(store)


def js_digest(path: Path) -> str:
    import blake3

    return blake3.blake3(path.read_bytes()).hexdigest()


def test_different_spec_is_a_conflict(store: Path, raw: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.raw"
    other.write_bytes(os.urandom(3 * CHUNK))
    ok(store, "image", "import", "disk", str(raw))
    ok(store, "volume", "create", "vm", "--from", "disk")
    ok(store, "volume", "create", "tmp", "--blank-dir", "--grace", "10m")
    before = snapshot_of(store)

    assert "different source" in conflict(store, "image", "import", "disk", str(other))
    assert "different source" in conflict(store, "image", "import", "disk", str(raw), "--chunk-size", "128K")
    for args in (
        ["vm", "--from", "disk", "--ro"],
        ["vm", "--blank-dir"],
        ["tmp", "--blank-dir"],  # without the grace period it asked for before
        ["tmp", "--blank-dir", "--grace", "11m"],
    ):
        assert "different spec" in conflict(store, "volume", "create", *args)
    assert snapshot_of(store) == before
    assert_consistent(store)


def test_rm_if_exists(store: Path) -> None:
    for noun, name in (("image", "nope"), ("volume", "nope"), ("snapshot", "nope@1")):
        assert casfs(store, noun, "rm", name).returncode == 3
        ok(store, noun, "rm", name, "--if-exists")
    ok(store, "volume", "create", "v", "--blank-dir")
    ok(store, "volume", "rm", "v")
    ok(store, "volume", "rm", "v", "--if-exists")
    assert js(store, "volume", "ls") == []


def stopped(proc: subprocess.Popen[str]) -> None:
    """Wait until `proc` has stopped itself (CASFS_STOP) at its fault point."""
    wait_stopped(proc.pid, lambda: proc.poll() is None)


@pytest.mark.parametrize(
    ("point", "phase"), [("import:after-claim", "queued"), ("import:running", "importing")]
)
def test_second_caller_of_an_import_in_progress_is_busy(
    store: Path, raw: Path, point: str, phase: str
) -> None:
    first = subprocess.Popen(
        [*CLI, "-s", str(store), "image", "import", "disk", str(raw)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(CASFS_STOP=point),
    )
    try:
        stopped(first)
        info = js(store, "image", "info", "disk")
        assert (info["phase"], info["owner_pid"]) == (phase, first.pid)
        for args in (["image", "import", "disk", str(raw)], ["image", "rm", "disk"]):
            msg = conflict(store, *args)
            assert f"image 'disk' is being imported by process {first.pid}" in msg
        first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert js(store, "image", "info", "disk")["phase"] == "ready"
    assert_consistent(store)


def test_second_caller_of_a_snapshot_in_progress_is_busy(store: Path) -> None:
    from casfs.repo import Repository
    from casfs.vfs.volume import open_volume

    ok(store, "volume", "create", "v", "--blank-dir")
    repo = Repository.open(store)
    try:  # an overlay, as a crashed daemon leaves it: the snapshot has a fold to do
        view = open_volume(repo, "v")
        view.write_sync(names(view).mknod(ROOT_INO, b"f", 0o100644, 0, 0, 0).ino, 0, b"x")
        view.flush_sync()
    finally:
        repo.close()
    first = subprocess.Popen(
        [*CLI, "-s", str(store), "snapshot", "create", "v"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(CASFS_STOP="snapshot:after-phase"),
    )
    try:
        stopped(first)
        info = js(store, "volume", "info", "v")
        assert (info["phase"], info["owner_pid"]) == ("snapshotting", first.pid)
        for args in (["snapshot", "create", "v"], ["volume", "rm", "v"], ["rollback", "v", "1"]):
            assert f"volume 'v' is snapshotting by process {first.pid}" in conflict(store, *args)
        first.send_signal(signal.SIGCONT)
        out, err = first.communicate(timeout=60)
        assert (first.returncode, out.strip()) == (0, "1"), err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert js(store, "volume", "info", "v")["phase"] == "ready"
    assert_consistent(store)


def test_io_error_after_the_start_leaves_a_failed_image(store: Path, raw: Path) -> None:
    """Refused input leaves no row (test_cli); an I/O error once the import runs keeps the
    image as phase failed with the reason, holding nothing, until replaced or removed."""
    before = snapshot_of(store)[3:]
    # Reading /proc/self/mem at offset 0 fails with EIO: a real I/O error, mid-import.
    p = casfs(store, "image", "import", "bad", "/proc/self/mem", "--format", "raw")
    assert p.returncode == 1 and "Input/output error" in p.stderr, p.stderr
    info = js(store, "image", "info", "bad")
    assert (info["phase"], info["root"], info["owner_pid"]) == ("failed", None, None)
    assert "Input/output error" in info["error"]
    assert snapshot_of(store)[3:] == before
    assert "not ready (phase failed)" in conflict(store, "volume", "create", "v", "--from", "bad")
    assert_consistent(store)
    ok(store, "image", "rm", "bad")
    casfs(store, "image", "import", "bad", "/proc/self/mem", "--format", "raw")
    ok(store, "image", "import", "bad", str(raw))  # a new import of the name replaces a failed one
    assert js(store, "image", "info", "bad")["phase"] == "ready"
    assert_consistent(store)


def test_default_chunk_size_by_kind_and_a_repeat_of_an_older_default(
    store: Path, raw: Path, tmp_path: Path
) -> None:
    """A disk image and a blank block volume get 32 KiB chunks, a tree 64 KiB. A repeat
    that names no chunk size repeats an import made with another one (an older default:
    64 KiB for disks), where naming a different size is a conflict."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f").write_bytes(b"x" * 100)
    ok(store, "image", "import", "disk", str(raw))
    ok(store, "image", "import", "tree", str(tree))
    ok(store, "volume", "create", "blank", "--blank-block", "1M")
    assert js(store, "image", "info", "disk")["chunk_size"] == 32 << 10
    assert js(store, "image", "info", "tree")["chunk_size"] == 64 << 10
    assert js(store, "volume", "info", "blank")["chunk_size"] == 32 << 10

    ok(store, "image", "import", "old", str(raw), "--chunk-size", "64K")
    before = snapshot_of(store)
    assert "already imported" in ok(store, "image", "import", "old", str(raw)).stdout
    assert "already imported" in ok(store, "image", "import", "disk", str(raw)).stdout
    assert snapshot_of(store) == before
    assert "different source" in conflict(store, "image", "import", "old", str(raw), "--chunk-size", "32K")
    assert js(store, "image", "info", "old")["chunk_size"] == 64 << 10
