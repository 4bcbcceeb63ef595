"""Chunk maps: the list of chunk ids that makes a file's or a disk's bytes.

Chunk n covers bytes [n*chunk_size, (n+1)*chunk_size). ZERO_ID marks a hole.

  root (MAP_ROOT)  "CMAP" v1 | depth u8 | chunk_size u32 | size u64 | count u32 | ids
                   depth 0: ids are chunk ids (at most PAGE_ENTRIES of them)
                   depth 1: ids are page ids, each page holding PAGE_ENTRIES chunk ids
  page (MAP_PAGE)  "CPAG" v1 | count u32 | chunk ids

So changing one chunk of a large map rewrites one 32 KiB page and the root. A page
that is all holes is itself a hole. A file no larger than one chunk skips the map:
its content id is the chunk id itself (see Content).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from casfs.errors import Corruption
from casfs.ids import ChunkNo
from casfs.kinds import BlobKind
from casfs.store.ids import ID_SIZE, ZERO_ID, BlobId

PAGE_ENTRIES = 1024
# Map pages a ChunkMap keeps (32 KiB each): 16 MiB covers a 16 GiB disk of 32 KiB chunks
# (a disk's default: VolumeKind.default_chunk_size), so random reads of it find their page.
_PAGES_KEPT = 512
_ROOT = struct.Struct("<4sBBIQI")
_PAGE = struct.Struct("<4sBI")
_ROOT_MAGIC = b"CMAP"
_PAGE_MAGIC = b"CPAG"
_VERSION = 1

Get = Callable[[BlobId], bytes]
Put = Callable[[bytes, BlobKind], BlobId]


def n_chunks(size: int, chunk_size: int) -> int:
    return -(-size // chunk_size)


def _pack_ids(ids: Sequence[bytes]) -> bytes:
    return b"".join(ids)


def _unpack_ids(raw: bytes, count: int, what: str) -> list[BlobId]:
    if len(raw) != count * ID_SIZE:
        raise Corruption(f"{what}: expected {count} ids, found {len(raw)} bytes")
    return [BlobId(raw[i : i + ID_SIZE]) for i in range(0, len(raw), ID_SIZE)]


@dataclass(frozen=True)
class MapRoot:
    depth: int
    chunk_size: int
    size: int
    ids: list[BlobId]

    def encode(self) -> bytes:
        head = _ROOT.pack(_ROOT_MAGIC, _VERSION, self.depth, self.chunk_size, self.size, len(self.ids))
        return head + _pack_ids(self.ids)

    @staticmethod
    def decode(plain: bytes) -> MapRoot:
        if len(plain) < _ROOT.size:
            raise Corruption("chunk-map root is truncated")
        magic, version, depth, chunk_size, size, count = _ROOT.unpack_from(plain)
        if magic != _ROOT_MAGIC or version != _VERSION or depth > 1 or chunk_size == 0:
            raise Corruption("not a chunk-map root")
        ids = _unpack_ids(plain[_ROOT.size :], count, "chunk-map root")
        # Every encoder writes one id per chunk (depth 0) or per page of them (depth 1):
        # any other count would read as holes past its ids, or fail an index (EIO).
        chunks = n_chunks(size, chunk_size)
        if count != (-(-chunks // PAGE_ENTRIES) if depth else chunks):
            what = "page" if depth else "chunk"
            raise Corruption(f"chunk-map root: {count} {what} ids for {chunks} chunks of {chunk_size} bytes")
        return MapRoot(depth, chunk_size, size, ids)


def encode_page(ids: Sequence[bytes]) -> bytes:
    return _PAGE.pack(_PAGE_MAGIC, _VERSION, len(ids)) + _pack_ids(ids)


def decode_page(plain: bytes) -> list[BlobId]:
    raw = page_ids(plain)
    return _unpack_ids(raw, len(raw) // ID_SIZE, "chunk-map page")


def page_ids(plain: bytes) -> bytes:
    """A page's ids as one string of ID_SIZE-byte ids (checked, not split)."""
    if len(plain) < _PAGE.size:
        raise Corruption("chunk-map page is truncated")
    magic, version, count = _PAGE.unpack_from(plain)
    if magic != _PAGE_MAGIC or version != _VERSION:
        raise Corruption("not a chunk-map page")
    raw = plain[_PAGE.size :]
    if len(raw) != count * ID_SIZE:
        raise Corruption(f"chunk-map page: expected {count} ids, found {len(raw)} bytes")
    return raw


def children(kind: BlobKind, plain: bytes) -> Iterator[tuple[BlobId, BlobKind]]:
    if kind == BlobKind.MAP_ROOT:
        root = MapRoot.decode(plain)
        child_kind = BlobKind.MAP_PAGE if root.depth else BlobKind.DATA
        return ((i, child_kind) for i in root.ids if i != ZERO_ID)
    return ((i, BlobKind.DATA) for i in decode_page(plain) if i != ZERO_ID)


def build_map(put: Put, chunk_ids: Sequence[BlobId], size: int, chunk_size: int) -> BlobId:
    """Store a map over chunk_ids (len == n_chunks(size, chunk_size)); returns its root id."""
    count = n_chunks(size, chunk_size)
    if len(chunk_ids) != count:
        raise ValueError(f"{len(chunk_ids)} chunk ids for {count} chunks")
    if count <= PAGE_ENTRIES:
        return put(MapRoot(0, chunk_size, size, list(chunk_ids)).encode(), BlobKind.MAP_ROOT)
    pages = [_put_page(put, chunk_ids[i : i + PAGE_ENTRIES]) for i in range(0, count, PAGE_ENTRIES)]
    return put(MapRoot(1, chunk_size, size, pages).encode(), BlobKind.MAP_ROOT)


def blank_map(put: Put, size: int, chunk_size: int) -> BlobId:
    """build_map() of a disk of holes only, without a list of its chunks (16 TiB of 32
    KiB chunks are 512M of them): every page of it is a hole."""
    count = n_chunks(size, chunk_size)
    depth, entries = (0, count) if count <= PAGE_ENTRIES else (1, -(-count // PAGE_ENTRIES))
    return put(MapRoot(depth, chunk_size, size, [ZERO_ID] * entries).encode(), BlobKind.MAP_ROOT)


def _put_page(put: Put, ids: Sequence[BlobId]) -> BlobId:
    if all(i == ZERO_ID for i in ids):
        return ZERO_ID
    return put(encode_page(ids), BlobKind.MAP_PAGE)


class ChunkMap:
    """Read side of a stored map, loading pages lazily."""

    def __init__(self, get: Get, root_id: BlobId) -> None:
        self.get = get
        self.root_id = root_id
        self.root = MapRoot.decode(get(root_id))
        self._count = n_chunks(self.root.size, self.root.chunk_size)
        self._pages: dict[int, bytes] = {}  # page number -> its ids (page_ids), oldest first

    @property
    def size(self) -> int:
        return self.root.size

    @property
    def chunk_size(self) -> int:
        return self.root.chunk_size

    def chunk(self, n: ChunkNo) -> BlobId:
        return self._chunk(n)

    def _chunk(self, n: int) -> BlobId:
        """chunk(), for the arithmetic on indices below."""
        if n < 0 or n >= self._count:
            return ZERO_ID
        if self.root.depth == 0:
            return self.root.ids[n]
        at = n % PAGE_ENTRIES * ID_SIZE
        return BlobId(self._page(n // PAGE_ENTRIES)[at : at + ID_SIZE])

    def chunk_run(self, first: int, count: int) -> list[BlobId]:
        """chunk(n) for n in [first, first + count): each page's ids sliced in one pass
        (a read plan's: the trio thread plans every read and each top-up of read-ahead,
        and a call of chunk() per chunk was most of a plan's cost)."""
        total = self._count
        if count == 1 and 0 <= first < total:  # (a small random read's: the loop below costs 3x)
            if self.root.depth == 0:
                return [self.root.ids[first]]
            at = first % PAGE_ENTRIES * ID_SIZE
            page = self._pages.get(first // PAGE_ENTRIES) or self._page(first // PAGE_ENTRIES)
            return [cast("BlobId", page[at : at + ID_SIZE])]
        lead = min(max(-first, 0), count)  # (before the start)
        out = [ZERO_ID] * lead
        n, stop = first + lead, min(first + count, total)
        while n < stop:
            if self.root.depth == 0:
                out += self.root.ids[n:stop]
                break
            p, at = divmod(n, PAGE_ENTRIES)
            upto = min(stop, (p + 1) * PAGE_ENTRIES)
            page = self._page(p)
            ends = range(at * ID_SIZE, (at + upto - n) * ID_SIZE, ID_SIZE)
            out += cast("list[BlobId]", [page[i : i + ID_SIZE] for i in ends])
            n = upto
        out += [ZERO_ID] * (count - len(out))  # (past the end)
        return out

    def _page(self, p: int) -> bytes:
        """Page p's ids. Kept as the page's bytes: a list of its 1,024 ids took 2.3x
        the memory (75 KiB) and 0.4-0.8 ms to make, against 2 us to check the bytes.
        At most _PAGES_KEPT of them, the oldest going first: random reads over a disk
        larger than they cover load one page per page they leave, not all of them
        again (as clearing them all did, every 64 pages)."""
        page = self._pages.get(p)
        if page is None:
            pid = self.root.ids[p]
            if pid == ZERO_ID:
                count = min(PAGE_ENTRIES, self._count - p * PAGE_ENTRIES)
                page = ZERO_ID * count
            else:
                page = page_ids(self.get(pid))
            if len(self._pages) >= _PAGES_KEPT:
                del self._pages[next(iter(self._pages))]
            self._pages[p] = page
        return page

    def data_chunks(self) -> list[ChunkNo]:
        """The numbers of the chunks holding data, in order; a page of holes costs
        nothing (a blank 64 GiB disk is its root alone)."""
        count = self._count
        if self.root.depth == 0:
            return [ChunkNo(n) for n, bid in enumerate(self.root.ids[:count]) if bid != ZERO_ID]
        found: list[ChunkNo] = []
        for p, pid in enumerate(self.root.ids):
            if pid != ZERO_ID:
                base = p * PAGE_ENTRIES
                found += [
                    ChunkNo(base + i) for i, bid in enumerate(decode_page(self.get(pid))) if bid != ZERO_ID
                ]
        return [n for n in found if n < count]

    def rewrite(self, put: Put, changes: Mapping[ChunkNo, BlobId], new_size: int) -> BlobId:
        """Store the map with `changes` applied and the size set; only touched pages
        (and the root) are written. Chunks past the new end are dropped."""
        cs = self.root.chunk_size
        old_count = self._count
        new_count = n_chunks(new_size, cs)
        if self.root.depth == 0 or new_count <= PAGE_ENTRIES:
            ids = [self._chunk(n) if n < old_count else ZERO_ID for n in range(new_count)]
            for n, cid in changes.items():
                if n < new_count:
                    ids[n] = cid
            return build_map(put, ids, new_size, cs)
        pages = list(self.root.ids)
        n_pages = -(-new_count // PAGE_ENTRIES)
        pages = pages[:n_pages] + [ZERO_ID] * max(0, n_pages - len(pages))
        touched = {n // PAGE_ENTRIES for n in changes if n < new_count}
        # A page cut by the new end, or the old last page when growing, changes length.
        touched.add(n_pages - 1)
        if old_count < new_count and old_count:
            touched.add((old_count - 1) // PAGE_ENTRIES)
        for p in sorted(touched):
            if p >= n_pages:
                continue
            start = p * PAGE_ENTRIES
            count = min(PAGE_ENTRIES, new_count - start)
            ids = [self._chunk(start + i) if start + i < old_count else ZERO_ID for i in range(count)]
            for i in range(count):
                changed = changes.get(ChunkNo(start + i))
                if changed is not None:
                    ids[i] = changed
            pages[p] = _put_page(put, ids)
        return put(MapRoot(1, cs, new_size, pages).encode(), BlobKind.MAP_ROOT)


class Content:
    """A file's bytes as chunk ids, whichever way they are stored: no blob (ZERO_ID),
    one direct chunk (size <= chunk_size), or a chunk map."""

    def __init__(
        self, get: Get, content_id: BlobId, size: int, chunk_size: int, mapped: bool | None = None
    ) -> None:
        """`mapped` overrides the size rule, for a file whose size changed since
        `content_id` was written (the catalog's blob kind tells)."""
        self.content_id = content_id
        self.size = size
        self.chunk_size = chunk_size
        if mapped is None:
            mapped = is_mapped(content_id, size, chunk_size)
        self.map = ChunkMap(get, content_id) if mapped and content_id != ZERO_ID else None

    def chunk(self, n: ChunkNo) -> BlobId:
        if self.map is not None:
            return self.map.chunk(n)
        return self.content_id if n == 0 else ZERO_ID

    def chunk_run(self, first: int, count: int) -> list[BlobId]:
        """chunk(n) for n in [first, first + count) (ChunkMap.chunk_run)."""
        if self.map is not None:
            return self.map.chunk_run(first, count)
        return [self.content_id if n == 0 else ZERO_ID for n in range(first, first + count)]

    def rewrite(self, put: Put, changes: Mapping[ChunkNo, BlobId], new_size: int) -> BlobId:
        if new_size <= self.chunk_size:
            return changes.get(ChunkNo(0), self.chunk(ChunkNo(0))) if new_size > 0 else ZERO_ID
        if self.map is not None:
            return self.map.rewrite(put, changes, new_size)
        ids = [self.chunk(ChunkNo(n)) for n in range(n_chunks(new_size, self.chunk_size))]
        for n, cid in changes.items():
            if n < len(ids):
                ids[n] = cid
        return build_map(put, ids, new_size, self.chunk_size)


def is_mapped(content_id: BlobId, size: int, chunk_size: int) -> bool:
    return content_id != ZERO_ID and size > chunk_size


def build_content(put: Put, chunk_ids: Sequence[BlobId], size: int, chunk_size: int) -> BlobId:
    if size <= chunk_size:
        return chunk_ids[0] if chunk_ids else ZERO_ID
    if all(c == ZERO_ID for c in chunk_ids):
        return ZERO_ID
    return build_map(put, chunk_ids, size, chunk_size)


def content_kind(size: int, chunk_size: int) -> BlobKind:
    """The blob kind a file's content id names."""
    return BlobKind.MAP_ROOT if size > chunk_size else BlobKind.DATA
