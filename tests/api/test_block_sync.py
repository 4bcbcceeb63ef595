"""A block volume's sync runs beside writes (casfs.fuse.rwsession.flush): while the
written epoch's fdatasync waits for the disk, writes go on; a second flush waits for
the first, then makes durable what came after it; everything synced reads back from
the files after the view is dropped (as a kill -9 would leave them)."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from casfs import images, volumes
from casfs.fuse import rwsession
from casfs.ids import ROOT_INO
from casfs.repo import Repository
from casfs.store.ids import BlobId
from casfs.vfs.api import Fetched, assemble
from casfs.vfs.overlay.upper import CLUSTER, Sync, Upper
from casfs.vfs.rw.volume import RwVolume
from casfs.vfs.volume import open_volume
from tests.helpers.volumes import block

SIZE = 1 << 20


def _volume(repo: Repository, tmp_path: Path) -> RwVolume:
    (tmp_path / "disk.img").write_bytes(bytes(SIZE))
    images.import_image(repo, "disk", tmp_path / "disk.img")
    volumes.create_volume(repo, "vm", volumes.Source(image="disk"))
    v = open_volume(repo, "vm")
    block(v)
    return v


def _read(v: RwVolume, offset: int, size: int) -> bytes:
    return assemble(v.read_plan(ROOT_INO, offset, size), v.repo.get)


async def _write(v: RwVolume, offset: int, data: bytes) -> None:
    async def fetch(ids: list[BlobId]) -> Fetched:
        raise AssertionError("whole blocks need nothing from below")

    await rwsession.mutate(v, lambda fetched: v.write(ROOT_INO, offset, data, fetched), fetch, 1 << 30)


def test_writes_go_on_while_the_upper_syncs(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = _volume(repo, tmp_path)
    v.write_sync(ROOT_INO, 0, b"a" * 4096)
    v.flush_sync()  # (the epoch's first sync names it in the catalog: that one freezes the view)
    started, go_on = threading.Event(), threading.Event()
    real_sync = Upper.sync
    syncs: list[int] = []

    def slow_sync(self: Upper, job: Sync) -> None:
        syncs.append(job.writes)
        if len(syncs) == 1:
            started.set()
            assert go_on.wait(10)
        real_sync(self, job)

    monkeypatch.setattr(Upper, "sync", slow_sync)

    async def main() -> None:
        await _write(v, 4096, b"b" * 4096)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rwsession.flush, v)
            await trio.to_thread.run_sync(started.wait)
            with trio.fail_after(5):  # not held behind the sync
                await _write(v, 8192, b"c" * 4096)
            second = trio.Event()

            async def flush_again() -> None:
                await rwsession.flush(v)
                second.set()

            nursery.start_soon(flush_again)
            await trio.testing.wait_all_tasks_blocked()
            syncing = rwsession.lock(v).syncing
            # It waits for the sync before it: parked on that sync's event, not done.
            assert syncing is not None and syncing.statistics().tasks_waiting == 1
            assert not second.is_set()
            go_on.set()
        assert second.is_set()

    trio.run(main)
    assert syncs == [2, 3]  # in capture order, the second covering the write made meanwhile
    upper = block(v).upper
    assert upper is not None and not upper.dirty
    again = open_volume(repo, "vm")  # from the files, as a crash would leave them
    block(again)
    assert _read(again, 0, 3 * 4096) == b"a" * 4096 + b"b" * 4096 + b"c" * 4096


def test_the_zeros_a_write_fills_its_cluster_with_are_never_read(repo: Repository, tmp_path: Path) -> None:
    """A small write into an empty cluster of the upper file writes the whole cluster
    (casfs.vfs.overlay.upper.CLUSTER), zeros around it: the blocks around the write
    still read from below, before the sync and from the files after it."""
    base = random.Random(8).randbytes(SIZE)
    (tmp_path / "disk.img").write_bytes(base)
    images.import_image(repo, "disk", tmp_path / "disk.img")
    volumes.create_volume(repo, "vm", volumes.Source(image="disk"))
    v = open_volume(repo, "vm")
    block(v)
    at, data = CLUSTER + 3 * 4096, b"x" * 4096
    v.write_sync(ROOT_INO, at, data)
    want = base[:at] + data + base[at + len(data) :]
    assert _read(v, 0, 3 * CLUSTER) == want[: 3 * CLUSTER]
    v.flush_sync()
    again = open_volume(repo, "vm")
    block(again)
    assert _read(again, 0, SIZE) == want
