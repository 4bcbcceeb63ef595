"""The daemon's side of read/write mounts: one writer per volume, the phase while
mounted, snapshot on unmount reported by `casfs umount`, a snapshot by setfattr; and
the chunk cache under the read path (no mount)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import trio

from casfs import volumes
from casfs.errors import Corruption
from casfs.fuse.daemon import READ_AHEAD_KB
from casfs.repo import Repository
from casfs.store.ids import BlobId, blob_id
from casfs.vfs.api import ReadPiece
from casfs.vfs.chunks import ChunkCache
from casfs.vfs.plan import plan_pieces
from tests.helpers.cli import casfs, run
from tests.helpers.mount import cleanup, is_mounted, mounted


@pytest.fixture
def rw_volume(repo: Repository) -> Repository:
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    return repo


def phase(repo: Repository, name: str) -> tuple[str, int | None]:
    row = repo.conn.execute("SELECT phase, owner_pid FROM volumes WHERE name = ?", (name,)).fetchone()
    return row[0], row[1]


def test_one_read_write_daemon_per_volume(rw_volume: Repository, tmp_path: Path) -> None:
    repo = rw_volume
    with mounted(repo.path, tmp_path / "a", volume="v") as m:
        assert phase(repo, "v") == ("mounted", m.pid)
        (tmp_path / "b").mkdir()
        second = casfs(repo.path, "mount", tmp_path / "b", "--volume", "v")
        assert second.returncode == 4 and "mounted by process" in second.stderr
        assert not is_mounted(tmp_path / "b")
        # read-only, any number may mount it
        with mounted(repo.path, tmp_path / "c", volume="v", ro=True) as ro:
            assert os.listdir(ro.path) == []
        assert run(["getfattr", "--only-values", "-n", "user.casfs.phase", m.path]).stdout == "mounted"
    assert phase(repo, "v") == ("ready", None)


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel's read-ahead is set by root only")
def test_the_mount_reads_ahead_a_mebibyte(rw_volume: Repository, tmp_path: Path) -> None:
    with mounted(rw_volume.path, tmp_path / "a", volume="v") as m:
        dev = os.stat(m.path).st_dev
        setting = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        assert int(setting.read_text()) == READ_AHEAD_KB


def test_a_dead_holder_does_not_block_the_volume(rw_volume: Repository, tmp_path: Path) -> None:
    repo = rw_volume
    repo.conn.execute("UPDATE volumes SET phase = 'mounted', owner_pid = 999999999 WHERE name = 'v'")
    with mounted(repo.path, tmp_path / "a", volume="v") as m:
        assert phase(repo, "v") == ("mounted", m.pid)


def test_umount_reports_the_snapshot_of_a_changed_volume(rw_volume: Repository, tmp_path: Path) -> None:
    repo = rw_volume
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        assert casfs(repo.path, "mount", mnt, "--volume", "v").returncode == 0
        (mnt / "f").write_text("written\n")
        done = run(["setfattr", "-n", "user.casfs.snapshot", "-v", "while mounted", mnt])
        assert done.returncode == 0, done.stderr
        assert run(["getfattr", "--only-values", "-n", "user.casfs.snapshots", mnt]).stdout == "1"
        (mnt / "g").write_text("more\n")
        bye = casfs(repo.path, "umount", mnt)
        assert bye.returncode == 0, bye.stderr
        assert bye.stdout.splitlines() == ["snapshot v@2"]
    finally:
        cleanup(mnt, None)
    assert [s.label for s in volumes.list_snapshots(repo, "v")] == ["while mounted", None]
    # an unchanged volume gets no snapshot
    assert casfs(repo.path, "mount", mnt, "--volume", "v").returncode == 0
    try:
        assert (mnt / "g").read_text() == "more\n"
        bye = casfs(repo.path, "umount", mnt)
        assert bye.returncode == 0 and bye.stdout == ""
    finally:
        cleanup(mnt, None)


def test_a_missing_mount_point(rw_volume: Repository, tmp_path: Path) -> None:
    done = casfs(rw_volume.path, "mount", tmp_path / "nowhere", "--volume", "v")
    assert done.returncode == 3 and "does not exist" in done.stderr


# -- the chunk cache, without a mount ------------------------------------------------


class Blobs:
    def __init__(self, n: int) -> None:
        self.by_id: dict[BlobId, bytes] = {}
        for i in range(n):
            plain = bytes([i % 251]) * 4096 + os.urandom(16)
            self.by_id[blob_id(plain)] = plain
        self.bad: set[BlobId] = set()
        self.reads = 0

    def get(self, bid: BlobId) -> bytes:
        self.reads += 1
        time.sleep(0.001)
        if bid in self.bad:
            raise Corruption(f"blob {bid.hex()} is corrupt")
        return self.by_id[bid]


def test_chunk_cache_counts_corruption_and_reads_once() -> None:
    blobs = Blobs(8)
    ids = list(blobs.by_id)
    blobs.bad.add(ids[3])
    cache = ChunkCache(blobs.get, max_bytes=1 << 20, workers=0)
    assert cache.fetch(ids[0]) == blobs.by_id[ids[0]]
    assert cache.fetch(ids[0]) == blobs.by_id[ids[0]] and blobs.reads == 1
    assert cache.cached(ids[0]) is not None and cache.cached(ids[1]) is None
    with pytest.raises(Corruption):
        cache.fetch(ids[3])
    with pytest.raises(Corruption):
        cache.fetch_uncached(ids[3])
    assert cache.corrupt_reads == 2 and list(cache.last_corrupt) == [ids[3], ids[3]]
    have, missing = cache.split(
        [ReadPiece(0, 10, ids[0]), ReadPiece(0, 10, ids[1]), ReadPiece(0, 10, data=b"x")]
    )
    assert list(have) == [ids[0]] and missing == [ids[1]]


async def test_read_ahead_follows_a_sequential_reader() -> None:
    blobs = Blobs(64)
    ids = list(blobs.by_id)
    # 64 KiB chunks, as casfs's (their bytes here are smaller: only the ids matter to the
    # plan), so that the random reads below jump further than the slack a sequential
    # reader is allowed (readpolicy._SEQ_SLACK, 1 MiB).
    cs = 64 << 10

    def plan(offset: int, size: int) -> list[ReadPiece]:
        return plan_pieces(lambda first, count: ids[first : first + count], len(ids) * cs, cs, offset, size)

    cache = ChunkCache(blobs.get, max_bytes=1 << 22, readahead_bytes=16 * cs, workers=2)
    try:
        for n in range(4):  # sequential reads: read-ahead starts after two
            got = await cache.fetch_async([p.blob for p in plan(n * cs, cs)])
            assert got[ids[n]] == blobs.by_id[ids[n]]
            cache.readahead("f", n * cs, cs, plan)
        with trio.fail_after(10):
            # Polled: read-ahead runs in the cache's own threads, which signal no trio.Event,
            # and counts a run of chunks once all of it is loaded, so wait for the count.
            while cache.prefetched < 10 or cache.cached(ids[15]) is None:  # noqa: ASYNC110
                await trio.sleep(0.01)
        # A random reader gets no read-ahead: no prefetch is even asked for (checked at
        # the call, not by the count, which loads still in flight may yet move).
        asked: list[list[BlobId]] = []
        cache.prefetch = lambda bids, chunk_bytes: asked.append(list(bids))  # type: ignore[method-assign]
        for n in (40, 5, 60):
            cache.readahead("g", n * cs, cs, plan)
        assert asked == []
    finally:
        cache.close()


async def test_a_reader_waits_for_read_ahead_and_gets_its_checks() -> None:
    """Chunks read-ahead is loading are awaited where they are, all together, and come
    back verified: a blob read-ahead found corrupt raises Corruption to the reader that
    waits for it, and is counted; a chunk nobody loads is left to fetch."""
    blobs = Blobs(9)
    ids = list(blobs.by_id)
    gate = threading.Event()

    def get(bid: BlobId) -> bytes:
        gate.wait(10)
        return blobs.get(bid)

    blobs.bad.add(ids[7])
    cache = ChunkCache(get, workers=2)
    try:
        cache.prefetch(ids[:8], 4096)
        loading, rest = cache.loading(ids[:6] + ids[8:])
        assert [bid for bid, _ in loading] == ids[:6] and rest == ids[8:]
        bad, _ = cache.loading([ids[7]])
        gate.set()
        with trio.fail_after(10):
            assert await cache.loaded(loading) == {bid: blobs.by_id[bid] for bid in ids[:6]}
            with pytest.raises(Corruption):
                await cache.loaded(bad)
        assert cache.corrupt_reads == 1 and list(cache.last_corrupt) == [ids[7]]
        assert cache.loading(ids[8:]) == ([], ids[8:])
    finally:
        cache.close()


def test_plan_pieces_cuts_at_chunks_and_the_end() -> None:
    ids = [BlobId(bytes([i]) * 32) for i in range(4)]
    pieces = plan_pieces(lambda first, count: ids[first : first + count], 10_000, 4096, 4000, 5000)
    want = [(4000, 4096, ids[0]), (0, 4096, ids[1]), (0, 808, ids[2])]
    assert [(p.start, p.end, p.blob) for p in pieces] == want
    assert plan_pieces(lambda first, count: ids[first : first + count], 10_000, 4096, 10_000, 10) == []
