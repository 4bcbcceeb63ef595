"""The whole-file cache behind passthrough, without a mount: what enters it, its key,
its bound."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import blake3
import pytest

from casfs.errors import Corruption
from casfs.fuse.passthrough import content_key
from casfs.store.filecache import FileCache, Part
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.api import ReadPiece

CHUNK = 1 << 16


def blob(data: bytes) -> tuple[BlobId, bytes]:
    return BlobId(blake3.blake3(data).digest()), data


def parts(pieces: list[ReadPiece]) -> list[Part]:
    return [(p.blob, p.start, p.end) for p in pieces]


def plan(*chunks: bytes | None) -> tuple[list[ReadPiece], dict[BlobId, bytes]]:
    """A file of whole chunks (None: a hole), as a read plan and its blobs."""
    pieces, blobs = [], {}
    for data in chunks:
        if data is None:
            pieces.append(ReadPiece(0, CHUNK))
            continue
        bid, _ = blob(data)
        blobs[bid] = data
        pieces.append(ReadPiece(0, len(data), bid))
    return pieces, blobs


def test_a_fill_writes_the_file_with_its_holes_read_only(tmp_path: Path) -> None:
    a, b = os.urandom(CHUNK), os.urandom(100)
    pieces, blobs = plan(a, None, b)
    size = 2 * CHUNK + 100
    key = content_key(size, pieces)
    assert key is not None
    cache = FileCache(tmp_path / "files")
    path = cache.fill(key, parts(pieces), blobs.__getitem__)
    assert path.read_bytes() == a + bytes(CHUNK) + b
    st = path.stat()
    assert st.st_mode & 0o777 == 0o400
    assert st.st_blocks * 512 < size  # the hole stayed one
    assert cache.lookup(key) == path
    assert cache.lookup("0" * 64) is None
    assert cache.check() == []  # its recorded digest matches


def test_check_removes_a_file_whose_bytes_changed(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "files")
    kept: list[Path] = []
    changed: list[Path] = []
    stripped: list[Path] = []
    for names in (kept, changed, stripped):
        pieces, blobs = plan(os.urandom(CHUNK))
        key = content_key(CHUNK, pieces)
        assert key is not None
        names.append(cache.fill(key, parts(pieces), blobs.__getitem__))
    with open(changed[0], "r+b") as f:
        f.seek(CHUNK // 2)
        f.write(b"?")
    os.removexattr(stripped[0], "user.casfs.blake3")
    found = dict(cache.check())
    assert found.keys() == {changed[0].name, stripped[0].name}
    assert "does not match" in found[changed[0].name]
    assert [p.name for p in (tmp_path / "files").iterdir()] == [kept[0].name]


def test_the_key_names_the_content_not_the_file() -> None:
    a = os.urandom(CHUNK)
    same, _ = plan(a, None)
    assert content_key(2 * CHUNK, same) == content_key(2 * CHUNK, plan(a, None)[0])
    assert content_key(2 * CHUNK, same) != content_key(2 * CHUNK, plan(None, a)[0])
    assert content_key(2 * CHUNK, same) != content_key(2 * CHUNK + 1, same)
    # bytes that are not all in blobs (an upper file's, in memory) are not cached
    assert content_key(5, [ReadPiece(0, 5, ZERO_ID, data=b"hello")]) is None


def test_a_failed_fill_leaves_nothing(tmp_path: Path) -> None:
    pieces, _ = plan(os.urandom(CHUNK), os.urandom(CHUNK))

    def damaged(bid: BlobId) -> bytes:
        raise Corruption(f"blob {bid.hex()} fails its check")

    cache = FileCache(tmp_path / "files")
    key = content_key(2 * CHUNK, pieces)
    assert key is not None
    with pytest.raises(Corruption):
        cache.fill(key, parts(pieces), damaged)
    assert list((tmp_path / "files").iterdir()) == []


def test_the_cache_keeps_to_its_bound_least_recently_used_first(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "files", limit=3 * CHUNK + CHUNK // 2)  # (and their xattr blocks)
    keys = []
    for i in range(3):
        pieces, blobs = plan(os.urandom(CHUNK))
        key = content_key(CHUNK, pieces)
        assert key is not None
        cache.fill(key, parts(pieces), blobs.__getitem__)
        os.utime(tmp_path / "files" / key, (1000 + i, 1000 + i))
        keys.append(key)
    assert cache.lookup(keys[0]) is not None  # used again: now the newest
    pieces, blobs = plan(os.urandom(CHUNK), os.urandom(CHUNK))
    key = content_key(2 * CHUNK, pieces)
    assert key is not None
    cache.fill(key, parts(pieces), blobs.__getitem__)
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == sorted([keys[0], key])


def test_temporary_files_of_dead_fills_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    (root / ".fill-abc.0badf00d").write_bytes(b"partial")  # its fill died: no lock on it
    live = root / ".fill-def.12345678"
    live.write_bytes(b"in flight")
    with open(live, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        FileCache(root).trim()
    assert [p.name for p in root.iterdir()] == [live.name]
