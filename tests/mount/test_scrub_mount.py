"""Scrub beside a live mount: it names the damage a reader meets, and a heal from
another store makes the mounted file read right again, without a remount."""

from __future__ import annotations

import contextlib
import errno
import json
import os
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
