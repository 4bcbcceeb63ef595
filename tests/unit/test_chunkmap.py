"""ChunkMap's page cache: bounded, oldest page out first, never a wrong id; a root
that does not hold one id per chunk (or per page of them) is refused as Corruption."""

from __future__ import annotations

import os

import pytest

from casfs.errors import Corruption
from casfs.ids import ChunkNo
from casfs.kinds import BlobKind
from casfs.snapshots import chunkmap
from casfs.store.ids import ZERO_ID, BlobId, blob_id


def test_pages_are_kept_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunkmap, "_PAGES_KEPT", 2)
    blobs: dict[BlobId, bytes] = {}

    def put(plain: bytes, kind: BlobKind) -> BlobId:
        bid = blob_id(plain)
        blobs[bid] = plain
        return bid

    gets: list[BlobId] = []

    def get(bid: BlobId) -> bytes:
        gets.append(bid)
        return blobs[bid]

    n = 5 * chunkmap.PAGE_ENTRIES
    ids = [BlobId(os.urandom(32)) for _ in range(n)]
    ids[chunkmap.PAGE_ENTRIES : 2 * chunkmap.PAGE_ENTRIES] = [
        ZERO_ID
    ] * chunkmap.PAGE_ENTRIES  # a page of holes
    cmap = chunkmap.ChunkMap(get, chunkmap.build_map(put, ids, n << 16, 1 << 16))
    for order in (list(range(n)), list(reversed(range(n)))):
        assert [cmap.chunk(ChunkNo(i)) for i in order] == [ids[i] for i in order]
        assert len(cmap._pages) <= 2
    gets.clear()
    for i in range(0, chunkmap.PAGE_ENTRIES, 7):  # page 0 is kept (read last): no load
        assert cmap.chunk(ChunkNo(i)) == ids[i]
    assert gets == []
    assert cmap.chunk(ChunkNo(n)) == ZERO_ID  # past the end


@pytest.mark.parametrize("n", [3, 2 * chunkmap.PAGE_ENTRIES + 5])  # depth 0, depth 1
def test_chunk_run_is_chunk_of_each(n: int) -> None:
    """chunk_run(first, count) slices pages where chunk() looks up one id: the same ids,
    across page boundaries, a page of holes, and before the start and past the end."""
    blobs: dict[BlobId, bytes] = {}

    def put(plain: bytes, kind: BlobKind) -> BlobId:
        blobs[blob_id(plain)] = plain
        return blob_id(plain)

    ids = [BlobId(os.urandom(32)) for _ in range(n)]
    if n > chunkmap.PAGE_ENTRIES:
        ids[chunkmap.PAGE_ENTRIES : 2 * chunkmap.PAGE_ENTRIES] = [ZERO_ID] * chunkmap.PAGE_ENTRIES
    cmap = chunkmap.ChunkMap(blobs.__getitem__, chunkmap.build_map(put, ids, n << 16, 1 << 16))
    edges = sorted({0, 1, n - 2, n - 1, n, chunkmap.PAGE_ENTRIES - 1, chunkmap.PAGE_ENTRIES})
    for first in [-2, *edges]:
        for count in (0, 1, 2, 17, chunkmap.PAGE_ENTRIES + 3, n + 4):
            want = [cmap.chunk(ChunkNo(i)) for i in range(first, first + count)]
            assert cmap.chunk_run(first, count) == want, (first, count)
    single = chunkmap.Content(blobs.__getitem__, ids[0], 100, 1 << 16)  # one direct chunk
    assert single.chunk_run(0, 3) == [ids[0], ZERO_ID, ZERO_ID]


@pytest.mark.parametrize("size", [1, 12345, 1 << 20, (chunkmap.PAGE_ENTRIES << 15) + 1, 3 << 30])
def test_a_blank_map_is_the_map_of_all_holes(size: int) -> None:
    """blank_map stores what build_map stores for a disk of holes (so a blank volume's
    base is the same blob either way), without a list of every chunk."""
    blobs: dict[BlobId, bytes] = {}

    def put(plain: bytes, kind: BlobKind) -> BlobId:
        blobs[blob_id(plain)] = plain
        return blob_id(plain)

    holes = [ZERO_ID] * chunkmap.n_chunks(size, 1 << 15)
    root = chunkmap.blank_map(put, size, 1 << 15)
    assert root == chunkmap.build_map(put, holes, size, 1 << 15)
    assert list(blobs) == [root]  # (no page: each is a hole)
    cmap = chunkmap.ChunkMap(blobs.__getitem__, root)
    assert (cmap.size, cmap.chunk_size) == (size, 1 << 15)
    assert cmap.chunk(ChunkNo(len(holes) - 1)) == ZERO_ID


PE = chunkmap.PAGE_ENTRIES


@pytest.mark.parametrize(
    ("depth", "count", "chunks"),
    [(0, 2, 3), (0, 4, 3), (0, 1, 0), (1, 1, PE + 1), (1, 3, PE + 1), (1, 2, 2 * PE + 1)],
)
def test_a_root_whose_id_count_disagrees_with_its_size_is_refused(
    depth: int, count: int, chunks: int
) -> None:
    """A root cut to fewer ids, or padded with more, its count and bytes agreeing: read,
    it gave holes past its ids, or an IndexError (EIO with no word of why)."""
    plain = chunkmap.MapRoot(depth, 1 << 16, chunks << 16, [ZERO_ID] * count).encode()
    with pytest.raises(Corruption, match=f"{count} (chunk|page) ids for {chunks} chunks"):
        chunkmap.MapRoot.decode(plain)


def test_a_root_whose_bytes_disagree_with_its_count_is_refused() -> None:
    plain = chunkmap.MapRoot(0, 1 << 16, 3 << 16, [ZERO_ID] * 3).encode()
    assert chunkmap.MapRoot.decode(plain).ids == [ZERO_ID] * 3
    for wrong in (plain[:-1], plain[:-32], plain + b"\0", plain + bytes(32)):
        with pytest.raises(Corruption, match="expected 3 ids"):
            chunkmap.MapRoot.decode(wrong)


@pytest.mark.parametrize(
    ("old", "new"), [(3, 5), (5, 2), (PE, PE + 1), (PE + 1, PE), (2 * PE + 1, PE + 2), (PE + 2, 3 * PE)]
)
def test_every_encoder_writes_roots_that_decode(old: int, new: int) -> None:
    """build_map, blank_map and rewrite (growing, shrinking, across a page and across
    depth 0/1), with sizes ending inside a chunk: decode takes what each wrote."""
    cs = 4096
    blobs: dict[BlobId, bytes] = {}

    def put(plain: bytes, kind: BlobKind) -> BlobId:
        blobs[blob_id(plain)] = plain
        return blob_id(plain)

    ids = [blob_id(n.to_bytes(4, "little")) for n in range(old)]
    cmap = chunkmap.ChunkMap(blobs.__getitem__, chunkmap.build_map(put, ids, old * cs - 100, cs))
    changes = {ChunkNo(new - 1): blob_id(b"last")}
    grown = chunkmap.ChunkMap(blobs.__getitem__, cmap.rewrite(put, changes, new * cs - 7))
    want = [*ids[:new], *[ZERO_ID] * (new - old)]
    want[new - 1] = blob_id(b"last")
    assert grown.chunk_run(0, new) == want
    blank = chunkmap.ChunkMap(blobs.__getitem__, chunkmap.blank_map(put, new * cs - 7, cs))
    assert blank.chunk_run(0, new) == [ZERO_ID] * new
