"""Scrub beside a live mount: it names the damage a reader meets, and a heal from
another store makes the mounted file read right again, without a remount."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest

from casfs import images
from casfs.ids import ChunkNo
from casfs.repo import Repository
from casfs.snapshots.chunkmap import Content
from casfs.snapshots.tree import Tree
from casfs.store.ids import BlobId
from tests.helpers import blobs as blob_files
from tests.helpers.cli import casfs, ok
from tests.helpers.mount import mounted

CHUNK = 64 << 10


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")


def test_a_heal_reaches_a_mounted_reader(repo: Repository, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(4 * CHUNK)
    (src / "f.bin").write_bytes(data)
    images.import_image(repo, "tree", src, chunk_size=CHUNK)
    other = tmp_path / "other"
    ok(other, "init")
    with contextlib.closing(Repository.open(other)) as good:
        images.import_image(good, "tree", src, chunk_size=CHUNK)
    root = BlobId(bytes.fromhex(images.get_image(repo, "tree").root or ""))
    entry = Tree.decode(repo.get(root)).find(b"f.bin")
    assert entry is not None
    victim = Content(repo.get, entry.blob, entry.attrs.size, CHUNK).chunk(ChunkNo(1))

    blob_files.corrupt(repo, victim)
    with mounted(repo.path, tmp_path / "mnt") as m:
        path = m.path / "images/tree/f.bin"
        with pytest.raises(OSError) as err:
            path.read_bytes()
        assert err.value.errno == errno.EIO
        found = casfs(repo.path, "scrub", "--json")
        assert found.returncode == 5
        (damage,) = json.loads(found.stdout)["damaged"]
        assert damage["blob"] == victim.hex()
        assert {(h["subject"], h["path"], h["start"]) for h in damage["holders"]} == {
            ("image tree", "/f.bin", CHUNK)
        }
        healed = casfs(repo.path, "scrub", "--heal-from", other)
        assert healed.returncode == 0, healed.stderr
        assert "1 healed" in healed.stdout
        drop_caches()
        assert path.read_bytes() == data  # the same mount, the healed copy


def test_scrub_beside_writes_snapshots_gc_and_imports_finds_nothing(repo: Repository, tmp_path: Path) -> None:
    """A healthy store stays clean under scrub while everything else goes on."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        (src / f"f{i}").write_bytes(os.urandom(3 * CHUNK))
    images.import_image(repo, "base", src, chunk_size=CHUNK)
    ok(repo.path, "volume", "create", "vol", "--from", "base")
    stop = threading.Event()
    errors: list[str] = []
    rounds: list[int] = []

    def churn(mnt: Path) -> None:
        n = 0
        try:
            while not stop.is_set():
                n += 1
                (mnt / f"w{n % 5}").write_bytes(os.urandom(CHUNK + n))
                os.setxattr(mnt, "user.casfs.snapshot", f"s{n}".encode())
                other = tmp_path / f"imp{n}"
                other.mkdir()
                (other / "x").write_bytes(os.urandom(CHUNK))
                ok(repo.path, "image", "import", f"imp{n}", other)
                ok(repo.path, "image", "rm", f"imp{n}")
                ok(repo.path, "gc")
                rounds.append(n)
        except Exception as e:  # (reported by the test, not lost in the thread)
            errors.append(repr(e))

    with mounted(repo.path, tmp_path / "mnt", volume="vol") as m:
        worker = threading.Thread(target=churn, args=(m.path,))
        worker.start()
        try:
            deadline = time.monotonic() + 120
            while len(rounds) < 3 and not errors and time.monotonic() < deadline:  # three rounds
                done = casfs(repo.path, "scrub", "--json")
                assert done.returncode == 0, done.stdout + done.stderr
                assert json.loads(done.stdout)["damaged"] == []
        finally:
            stop.set()
            worker.join(timeout=120)
    assert errors == [] and len(rounds) >= 3
    assert repo.blobs.damaged() == set()
