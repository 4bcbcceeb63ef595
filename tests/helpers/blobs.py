"""A local store's blob bytes reached past the BlobStore interface, wherever they are (a
pack, or a blob file of a store made before packs): for the tests that damage, remove,
evict or count them on purpose, as a disk or an operator would."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from casfs.repo import Repository
from casfs.store import BlobStore
from casfs.store.ids import BlobId
from casfs.store.packstore import PackBlobStore


def local_store(repo: Repository | BlobStore) -> PackBlobStore:
    """The repository's blob store as the local pack store it is in these tests."""
    store = repo.blobs if isinstance(repo, Repository) else repo
    assert isinstance(store, PackBlobStore), store
    return store


def location(repo: Repository | BlobStore, bid: BlobId) -> tuple[str, int, int]:
    """(file, offset, stored length) of a published blob."""
    store = local_store(repo)
    where = store.index.locate(bid)
    if where is not None:
        name, offset, length = where
        return store.pack_path(name), offset, length
    assert store.legacy is not None, f"blob {bid.hex()} is not stored"
    path = store.legacy.path_str(bid)
    return path, 0, os.stat(path).st_size


def read_stored(repo: Repository | BlobStore, bid: BlobId) -> bytes:
    path, offset, length = location(repo, bid)
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def overwrite(repo: Repository | BlobStore, bid: BlobId, stored: bytes) -> None:
    """Make `stored` the blob's stored bytes (damage: the store never rewrites a blob).
    In a pack: in place when the length is the same, else appended to its pack and its
    index row moved there."""
    store = local_store(repo)
    path, offset, length = location(store, bid)
    os.chmod(path, 0o644)
    if store.index.locate(bid) is None:
        Path(path).write_bytes(stored)
        return
    fd = os.open(path, os.O_WRONLY)
    try:
        if len(stored) == length:
            os.pwrite(fd, stored, offset)
            return
        offset = os.lseek(fd, 0, os.SEEK_END)
        os.write(fd, stored)
    finally:
        os.close(fd)
    conn = sqlite3.connect(store.index.path)
    try:
        conn.execute("UPDATE blobs SET offset = ?, length = ? WHERE id = ?", (offset, len(stored), bid))
        conn.commit()
    finally:
        conn.close()
    # (The store never moves a row to other bytes: its remembered place of the blob,
    # which still holds the good copy, would be read. store.located)
    store.index.forget(bid)


def corrupt(repo: Repository | BlobStore, bid: BlobId) -> None:
    """Flip one bit in the middle of the blob's stored bytes."""
    stored = bytearray(read_stored(repo, bid))
    stored[len(stored) // 2] ^= 0x10
    overwrite(repo, bid, bytes(stored))


def remove(repo: Repository | BlobStore, bid: BlobId) -> None:
    """The blob's bytes are lost (its index row, or its file)."""
    local_store(repo).delete(bid)


def _index(store: Path, sql: str) -> set[str]:
    index = store / "packs" / "index.sqlite"
    if not index.exists():
        return set()
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        return {bytes(r[0]).hex() if isinstance(r[0], bytes) else str(r[0]) for r in conn.execute(sql)}
    finally:
        conn.close()


def blob_ids(store: Path) -> set[str]:
    """The hex ids of every blob the store at `store` holds (packed or in files), read
    from its files without opening it."""
    return {p.name for p in (store / "blobs").glob("*/*")} | _index(store, "SELECT id FROM blobs")


def stored_sizes(repo: Repository) -> dict[str, int]:
    """{hex id: stored bytes} of every blob stored, packed or in a file."""
    store = local_store(repo)
    return {bid.hex(): store.stored_size(bid) for bid in store.list()}


def stored_files(store: Path) -> list[str]:
    """What a command that stores nothing must not change: the ids stored, the pack
    files and what is staged (tmp/), as sorted names."""
    staged = [str(p.relative_to(store)) for p in (store / "tmp").rglob("*")]
    return sorted(blob_ids(store)) + sorted(pack_files(store)) + sorted(staged)


def pack_files(store: Path) -> set[str]:
    return {p.name.removesuffix(".pack") for p in (store / "packs").glob("*.pack")}


def indexed_packs(store: Path) -> set[str]:
    return _index(store, "SELECT name FROM packs")
