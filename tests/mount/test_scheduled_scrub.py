"""The scheduled scrub: a mount daemon scrubs its store as often as `scrub.every` says,
one process at a time, and says what it found."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path

import pytest

from casfs import images
from casfs.ids import ChunkNo
from casfs.repo import Repository
from casfs.snapshots.chunkmap import Content
from casfs.snapshots.tree import Tree
from casfs.store.ids import BlobId
from casfs.upkeep import scheduled
from tests.helpers import blobs as blob_files
from tests.helpers.cli import fails, ok, out
from tests.helpers.mount import mounted
from tests.helpers.snapshots import wait_until

CHUNK = 64 << 10


def tree_image(repo: Repository, tmp_path: Path) -> BlobId:
    """An image `tree`; the id of its file's second chunk."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(3 * CHUNK))
    images.import_image(repo, "tree", src, chunk_size=CHUNK)
    root = BlobId(bytes.fromhex(images.get_image(repo, "tree").root or ""))
    entry = Tree.decode(repo.get(root)).find(b"f.bin")
    assert entry is not None
    return Content(repo.get, entry.blob, entry.attrs.size, CHUNK).chunk(ChunkNo(1))


@pytest.mark.no_fsck("a blob is corrupted on purpose")
def test_a_mount_daemon_scrubs_on_schedule(repo: Repository, tmp_path: Path) -> None:
    victim = tree_image(repo, tmp_path)
    blob_files.corrupt(repo, victim)
    ok(repo.path, "config", "set", "scrub.every", "2s")
    last = scheduled.last_path(repo.path)
    with mounted(repo.path, tmp_path / "mnt") as m:
        wait_until("the scheduled scrub's record", last.exists, within=60)
        found = json.loads(last.read_text())
        assert found["damaged"] == [victim.hex()]
        # The record is written before the daemon logs what it found.
        wait_until("the scrub's log line", lambda: f"damaged: {victim.hex()}" in m.log())
    assert "scrub.every" in out(repo.path, "config", "ls")


def test_the_schedule_and_one_scrub_at_a_time(repo: Repository, tmp_path: Path) -> None:
    tree_image(repo, tmp_path)
    assert scheduled.seconds_until(repo.path) is None  # off by default
    ok(repo.path, "config", "set", "scrub.every", "1d")
    assert scheduled.seconds_until(repo.path) == 0.0  # never scrubbed: due now
    (repo.path / "scrub").mkdir(exist_ok=True)
    with open(repo.path / "scrub" / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process's turn
        assert scheduled.run(repo.path, threading.Event()) is None
    found = scheduled.run(repo.path, threading.Event())
    assert found is not None and found["damaged"] == [] and found["blobs"] > 0
    due = scheduled.seconds_until(repo.path)
    assert due is not None and 86_000 < due <= 86_400
    assert scheduled.run(repo.path, threading.Event()) is None  # not due again yet
    fails(repo.path, 2, "config", "set", "scrub.every", "often")
    ok(repo.path, "config", "set", "scrub.every", "off")
    assert scheduled.seconds_until(repo.path) is None
