"""A block volume's upper file on its own: the paged present-map, what a sync makes
durable (and what a torn or missing map write can and cannot lose), zeros punched,
the file allocated a cluster at a time, left-over epochs removed."""

from __future__ import annotations

import contextlib
import gc
import os
from pathlib import Path

import pytest

from casfs.store.uppers import local_bytes, remove_stale, upper_dir
from casfs.vfs.overlay.behind import BEHIND, MIN_BYTES
from casfs.vfs.overlay.upper import _PAGE_BLOCKS, BLOCK, CLUSTER, Upper, UpperError
from tests.helpers.mount import kernel_mounted

SIZE = 3 << 30  # three map pages (128 MiB of disk each) and then some


def synced(upper: Upper) -> None:
    job = upper.capture()
    assert job is not None
    upper.sync(job)
    upper.synced(job)


def test_the_map_marks_written_blocks_across_page_boundaries(tmp_path: Path) -> None:
    up = Upper.create(tmp_path, "v", SIZE)
    edge = _PAGE_BLOCKS - 2  # a write of 4 blocks across the first page boundary
    assert up.pwrite(edge * BLOCK, os.urandom(4 * BLOCK)) == 4
    assert up.pwrite(edge * BLOCK, os.urandom(BLOCK)) == 0  # rewritten: nothing new
    assert [up.present(b) for b in range(edge - 1, edge + 5)] == [False, True, True, True, True, False]
    assert up.mask(edge - 1, 6) == 0b011110
    assert up.chunks(16) == [(edge) // 16, (edge + 3) // 16]
    assert up.chunks(1) == list(range(edge, edge + 4))


def test_a_sync_makes_data_and_map_durable_and_reopens_the_same(tmp_path: Path) -> None:
    up = Upper.create(tmp_path, "v", SIZE)
    payload = os.urandom(3 * BLOCK)
    up.pwrite(10 * BLOCK, payload)
    up.pwrite(2 * _PAGE_BLOCKS * BLOCK, payload)
    job = up.capture()
    assert job is not None and job.first and sorted(job.pages) == [0, 2]
    up.sync(job)
    up.synced(job)
    assert not up.dirty and up.capture() is None
    again = Upper.open(tmp_path, "v", up.epoch, SIZE)
    assert again.chunks(16) == up.chunks(16)
    assert again.pread(10 * BLOCK, 3 * BLOCK) == payload
    assert again.mask(0, 64) == 0b111 << 10
    # Overwriting a present block dirties the data only: no map page to write.
    again.pwrite(10 * BLOCK, bytes(b"x" * BLOCK))
    job = again.capture()
    assert job is not None and job.pages == {} and not job.first


def test_bits_not_synced_are_not_there_after_a_crash(tmp_path: Path) -> None:
    """A crash between the data's fdatasync and the map's: the block reads as before
    (absent from the upper), never as garbage."""
    up = Upper.create(tmp_path, "v", SIZE)
    up.pwrite(0, b"a" * BLOCK)
    synced(up)
    up.pwrite(BLOCK, b"b" * BLOCK)  # written, never synced: its bit is in memory only
    after_crash = Upper.open(tmp_path, "v", up.epoch, SIZE)
    assert after_crash.present(0) and not after_crash.present(1)


def test_bytes_written_during_a_sync_stay_counted_as_unsynced(tmp_path: Path) -> None:
    """Writes go on while a sync runs (rwsession.flush): what it covered is no longer
    unsaved, what came after it still is, on a disk written to without a pause."""
    up = Upper.create(tmp_path, "v", SIZE)
    up.pwrite(0, os.urandom(2 * BLOCK))
    job = up.capture()
    assert job is not None
    up.pwrite(8 * BLOCK, os.urandom(BLOCK))  # (during the sync)
    up.sync(job)
    up.synced(job)
    assert up.unsynced_bytes == BLOCK
    synced(up)
    assert up.unsynced_bytes == 0


def test_a_failed_sync_keeps_its_pages_to_write(tmp_path: Path) -> None:
    up = Upper.create(tmp_path, "v", SIZE)
    up.pwrite(0, b"a" * BLOCK)
    job = up.capture()
    assert job is not None
    up.failed(job)
    retry = up.capture()
    assert retry is not None and retry.pages.keys() == job.pages.keys()


def test_zeros_over_written_blocks_free_their_space(tmp_path: Path) -> None:
    up = Upper.create(tmp_path, "v", SIZE)
    up.pwrite(0, os.urandom(64 * BLOCK))
    synced(up)
    assert local_bytes(tmp_path, "v", [up.epoch]) >= 64 * BLOCK
    up.pwrite(0, bytes(64 * BLOCK))
    job = up.capture()
    assert job is not None and job.punched
    up.sync(job)
    up.synced(job)
    assert local_bytes(tmp_path, "v", [up.epoch]) < 8 * BLOCK
    assert up.pread(0, 64 * BLOCK) == bytes(64 * BLOCK) and up.present(63)


def test_a_map_of_another_size_is_refused(tmp_path: Path) -> None:
    up = Upper.create(tmp_path, "v", SIZE)
    with pytest.raises(UpperError, match="does not match"):
        Upper.open(tmp_path, "v", up.epoch, SIZE * 2)
    with pytest.raises(UpperError, match="missing"):
        Upper.open(tmp_path, "v", up.epoch + 1, SIZE)


def test_left_over_epochs_are_removed(tmp_path: Path) -> None:
    keep = Upper.create(tmp_path, "v", SIZE)
    gone = Upper.create(tmp_path, "v", SIZE)
    assert gone.epoch != keep.epoch
    remove_stale(tmp_path, "v", {keep.epoch})
    assert sorted(os.listdir(upper_dir(tmp_path, "v"))) == [f"{keep.epoch}.data", f"{keep.epoch}.map"]


def test_zeros_over_a_block_whose_bit_a_crash_lost_read_as_zeros(tmp_path: Path) -> None:
    """After a crash, .data may hold bytes of a write whose bit was never synced: a
    zero write there must not just set the bit (the block is not a hole)."""
    up = Upper.create(tmp_path, "v", SIZE)
    up.pwrite(0, b"a" * BLOCK)
    synced(up)
    up.pwrite(BLOCK, b"b" * BLOCK)  # its bit dies with the process
    again = Upper.open(tmp_path, "v", up.epoch, SIZE)
    assert not again.present(1)
    again.pwrite(BLOCK, bytes(BLOCK))
    assert again.present(1) and again.pread(BLOCK, BLOCK) == bytes(BLOCK)


def test_a_large_write_is_handed_to_write_behind_and_reads_back(tmp_path: Path) -> None:
    """Write-behind starts the writeback of a large write (the sync still makes it
    durable); small writes are left to the sync."""
    up = Upper.create(tmp_path, "v", SIZE)
    before = BEHIND.started
    up.pwrite(0, os.urandom(BLOCK))
    assert BEHIND.started == before
    data = os.urandom(MIN_BYTES)
    up.pwrite(64 * BLOCK, data)
    assert BEHIND.started == before + 1
    BEHIND.wait_idle()
    synced(up)
    assert Upper.open(tmp_path, "v", up.epoch, SIZE).pread(64 * BLOCK, MIN_BYTES) == data


def allocated(up: Upper) -> list[tuple[int, int]]:
    """The .data file's allocated ranges (SEEK_DATA/SEEK_HOLE)."""
    fd, pos = up.data_fd(), 0
    out: list[tuple[int, int]] = []
    while True:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:
            return out
        pos = os.lseek(fd, start, os.SEEK_HOLE)
        out.append((start, pos))


def test_a_small_write_into_an_empty_cluster_allocates_the_cluster_and_marks_its_blocks_only(
    tmp_path: Path,
) -> None:
    up = Upper.create(tmp_path, "v", SIZE)
    per = CLUSTER // BLOCK
    b = 3 * per + 5  # a block in the middle of the fourth cluster
    data = os.urandom(2 * BLOCK)
    assert up.pwrite(b * BLOCK, data) == 2
    assert allocated(up) == [(3 * CLUSTER, 4 * CLUSTER)]
    assert up.mask(3 * per, per) == 0b11 << 5  # the zeros around it are not present
    assert up.pread(b * BLOCK, 2 * BLOCK) == data and up.unsynced_bytes == 2 * BLOCK
    # A later write into the same cluster never overwrites what is present there.
    more = os.urandom(BLOCK)
    assert up.pwrite(3 * per * BLOCK, more) == 1
    assert up.pread(b * BLOCK, 2 * BLOCK) == data and up.pread(3 * per * BLOCK, BLOCK) == more
    synced(up)
    again = Upper.open(tmp_path, "v", up.epoch, SIZE)
    assert again.mask(3 * per, per) == 0b11 << 5 | 1
    assert again.pread(b * BLOCK, 2 * BLOCK) == data


def test_a_write_across_two_empty_clusters_lands_where_it_was_aimed(tmp_path: Path) -> None:
    up = Upper.create(tmp_path, "v", SIZE)
    data = os.urandom(2 * BLOCK)
    assert up.pwrite(CLUSTER - BLOCK, data) == 2
    assert allocated(up) == [(CLUSTER - BLOCK, CLUSTER + BLOCK)]  # (as it came: no fill)
    assert up.pread(0, 2 * CLUSTER) == bytes(CLUSTER - BLOCK) + data + bytes(CLUSTER - BLOCK)
    assert up.mask(0, 2 * CLUSTER // BLOCK) == 0b11 << (CLUSTER // BLOCK - 1)


def test_a_write_into_the_last_partial_cluster_stays_within_the_disk(tmp_path: Path) -> None:
    size = 10 * CLUSTER + 3 * BLOCK  # the last cluster has 3 blocks
    up = Upper.create(tmp_path, "v", size)
    assert up.pwrite(size - 2 * BLOCK, os.urandom(BLOCK)) == 1
    assert os.fstat(up.data_fd()).st_size == size
    assert allocated(up) == [(10 * CLUSTER, size)]
    assert up.mask(10 * CLUSTER // BLOCK, 3) == 0b010


def test_a_cluster_whose_bits_a_crash_lost_is_filled_again_around_synced_blocks_only(
    tmp_path: Path,
) -> None:
    """A crash loses the bits of unsynced writes, not those a sync acknowledged: a
    cluster with a synced block is never filled again (its bytes stay), one whose only
    writes were lost may be (nothing there was acknowledged)."""
    up = Upper.create(tmp_path, "v", SIZE)
    kept, lost = os.urandom(BLOCK), os.urandom(BLOCK)
    up.pwrite(BLOCK, kept)  # cluster 0: filled, synced
    synced(up)
    up.pwrite(CLUSTER + BLOCK, lost)  # cluster 1: filled, its bit dies with the process
    again = Upper.open(tmp_path, "v", up.epoch, SIZE)
    assert not again.any_in(CLUSTER // BLOCK, CLUSTER // BLOCK)
    new = os.urandom(BLOCK)
    again.pwrite(2 * BLOCK, new)  # cluster 0 holds a present block: no zeros
    again.pwrite(CLUSTER + 2 * BLOCK, new)  # cluster 1 looks empty: filled again
    assert again.pread(BLOCK, 2 * BLOCK) == kept + new
    assert again.pread(CLUSTER + BLOCK, 2 * BLOCK) == bytes(BLOCK) + new
    assert again.mask(0, 2 * CLUSTER // BLOCK) == 0b110 | 0b100 << CLUSTER // BLOCK


def test_a_write_the_fill_has_no_room_for_is_written_alone(tmp_path: Path) -> None:
    """On a nearly full disk, a 4 KiB write into an empty cluster fits where the
    cluster's zeros do not: it is written alone, as without the fill."""
    with kernel_mounted(tmp_path / "fs", "-t", "tmpfs", "-o", "size=1M", "tmpfs") as fs:
        up = Upper.create(fs, "v", 16 * CLUSTER)
        filler = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):  # the disk full, then two blocks freed
            while True:
                os.write(filler, bytes(BLOCK))
        os.ftruncate(filler, os.fstat(filler).st_size - 2 * BLOCK)
        os.close(filler)
        data = os.urandom(BLOCK)
        assert up.pwrite(5 * CLUSTER + BLOCK, data) == 1
        assert up.pread(5 * CLUSTER + BLOCK, BLOCK) == data
        assert up.mask(5 * CLUSTER // BLOCK, CLUSTER // BLOCK) == 0b10
        synced(up)
        assert Upper.open(fs, "v", up.epoch, 16 * CLUSTER).pread(5 * CLUSTER + BLOCK, BLOCK) == data
        del up
        gc.collect()  # (an Upper closes its files from a thread once it is collected)
