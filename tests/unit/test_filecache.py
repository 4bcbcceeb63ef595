"""The whole-file cache behind passthrough, without a mount: what enters it, its key,
its bound."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import blake3
import pytest

from casfs.errors import Corruption
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.api import Piece
from casfs.vfs.filecache import FileCache, content_key

CHUNK = 1 << 16


def blob(data: bytes) -> tuple[BlobId, bytes]:
    return BlobId(blake3.blake3(data).digest()), data


def plan(*chunks: bytes | None) -> tuple[list[Piece], dict[BlobId, bytes]]:
    """A file of whole chunks (None: a hole), as a read plan and its blobs."""
    pieces, blobs = [], {}
    for data in chunks:
        if data is None:
            pieces.append(Piece(0, CHUNK))
            continue
        bid, _ = blob(data)
        blobs[bid] = data
        pieces.append(Piece(0, len(data), bid))
    return pieces, blobs


def test_a_fill_writes_the_file_with_its_holes_read_only(tmp_path: Path) -> None:
    a, b = os.urandom(CHUNK), os.urandom(100)
    pieces, blobs = plan(a, None, b)
    size = 2 * CHUNK + 100
    key = content_key(size, pieces)
    assert key is not None
    cache = FileCache(tmp_path / "files")
    path = cache.fill(key, pieces, blobs.__getitem__)
    assert path.read_bytes() == a + bytes(CHUNK) + b
    st = path.stat()
    assert st.st_mode & 0o777 == 0o400
    assert st.st_blocks * 512 < size  # the hole stayed one
    assert cache.lookup(key) == path
    assert cache.lookup("0" * 64) is None


def test_the_key_names_the_content_not_the_file() -> None:
    a = os.urandom(CHUNK)
    same, _ = plan(a, None)
    assert content_key(2 * CHUNK, same) == content_key(2 * CHUNK, plan(a, None)[0])
    assert content_key(2 * CHUNK, same) != content_key(2 * CHUNK, plan(None, a)[0])
    assert content_key(2 * CHUNK, same) != content_key(2 * CHUNK + 1, same)
    # bytes that are not all in blobs (an upper file's, in memory) are not cached
    assert content_key(5, [Piece(0, 5, ZERO_ID, data=b"hello")]) is None


def test_a_failed_fill_leaves_nothing(tmp_path: Path) -> None:
    pieces, _ = plan(os.urandom(CHUNK), os.urandom(CHUNK))

    def damaged(bid: BlobId) -> bytes:
        raise Corruption(f"blob {bid.hex()} fails its check")

    cache = FileCache(tmp_path / "files")
    key = content_key(2 * CHUNK, pieces)
    assert key is not None
    with pytest.raises(Corruption):
        cache.fill(key, pieces, damaged)
    assert list((tmp_path / "files").iterdir()) == []


def test_the_cache_keeps_to_its_bound_least_recently_used_first(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "files", limit=3 * CHUNK)
    keys = []
    for i in range(3):
        pieces, blobs = plan(os.urandom(CHUNK))
        key = content_key(CHUNK, pieces)
        assert key is not None
        cache.fill(key, pieces, blobs.__getitem__)
        os.utime(tmp_path / "files" / key, (1000 + i, 1000 + i))
        keys.append(key)
    assert cache.lookup(keys[0]) is not None  # used again: now the newest
    pieces, blobs = plan(os.urandom(CHUNK), os.urandom(CHUNK))
    key = content_key(2 * CHUNK, pieces)
    assert key is not None
    cache.fill(key, pieces, blobs.__getitem__)
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == sorted([keys[0], key])


def test_temporary_files_of_dead_fills_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    (root / f".fill-abc.{gone.pid}").write_bytes(b"partial")
    (root / f".fill-def.{os.getpid()}").write_bytes(b"in flight")
    FileCache(root).trim()
    assert [p.name for p in root.iterdir()] == [f".fill-def.{os.getpid()}"]
