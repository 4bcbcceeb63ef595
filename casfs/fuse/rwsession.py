"""A read/write view's life on the trio thread: its lock, mutations with the NeedChunks
retry, flushes and snapshots whose blocking halves run in worker threads, and the
age-based flush the daemon's timer asks for.

The lock (one trio.Lock per view) is held around every mutation, flush and snapshot,
*across* their awaits: that keeps the view frozen while a job's worker thread runs. The
view asserts it on every mutation (RwView.guard, installed here). Every write-back job
(casfs.vfs.api.Job) is driven the same way: lock, slot, thread, apply or abort (_run).
The whole protocol is stated once in docs/concurrency.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar
from weakref import WeakKeyDictionary

import trio

from casfs import metrics
from casfs.ids import SnapshotNo
from casfs.lifecycle.queue import acquire_slot
from casfs.store.ids import BlobId
from casfs.vfs.api import ROOT_INO, Fetched, Job, NeedChunks, NeedWork, RwView, View

log = logging.getLogger(__name__)

R = TypeVar("R")
J = TypeVar("J", bound=Job)


class ViewLock:
    """A view's lock: trio.Lock's rules (FIFO; a release hands the lock to the first
    waiter; not re-entrant) with its owner in plain sight. Called, it says whether the
    calling task holds it: it is the view's guard. An uncontended acquire and release
    are two attribute stores, and the guard one comparison, where trio.Lock's and its
    statistics() cost about 4.5 us together, a tenth of a 4 KiB write's handler."""

    __slots__ = ("_lot", "owner", "syncing")

    def __init__(self) -> None:
        self.owner: trio.lowlevel.Task | None = None
        self._lot = trio.lowlevel.ParkingLot()
        # Set while a sync runs beside writes (flush): every other flush waits for it.
        self.syncing: trio.Event | None = None

    def __call__(self) -> bool:
        return self.owner is trio.lowlevel.current_task()

    def acquire_nowait(self) -> bool:
        """Take the lock if it is free and no one waits for it (no checkpoint)."""
        if self.owner is None and not self._lot:
            self.owner = trio.lowlevel.current_task()
            return True
        return False

    async def acquire(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.acquire_nowait():
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        if self.owner is trio.lowlevel.current_task():
            raise RuntimeError("a view's lock is not re-entrant")
        await self._lot.park()  # woken as its owner: release() hands it over

    def release(self) -> None:
        assert self.owner is trio.lowlevel.current_task(), "a view's lock released by a task not holding it"
        self.owner = self._lot.unpark(count=1)[0] if self._lot else None

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


def lock(view: RwView) -> ViewLock:
    """The view's lock, which is its guard (made at first use, when the view learns to
    check it)."""
    held = view.guard
    if not isinstance(held, ViewLock):
        held = view.guard = ViewLock()
    return held


async def mutate(
    view: RwView,
    change: Callable[[Fetched], R],
    fetch: Callable[[list[BlobId]], Awaitable[Fetched]],
    dirty_limit_bytes: int,
) -> R:
    """Run one change under the view's lock. A change that needs chunks it does not have
    (NeedChunks), or slow local work done first (NeedWork: a copy-up), is retried once
    they are fetched or done; that awaits inside the lock on purpose: the change must
    see them unchanged."""
    fetched: Fetched = {}
    held = lock(view)
    if not held.acquire_nowait():  # (uncontended, nearly always: no trip through the scheduler)
        await held.acquire()
    try:
        if view.dirty_bytes > dirty_limit_bytes:
            # Before the change, not after: if the flush fails (a full disk), this
            # call fails having changed nothing, and what is buffered stays buffered.
            await _flush_locked(view)
        while True:
            try:
                return change(fetched)
            except NeedChunks as e:
                fetched.update(await fetch(e.ids))
            except NeedWork as e:
                await trio.to_thread.run_sync(e.run)
                e.apply()
    finally:
        held.release()


async def _run(job: J) -> J:
    """A prepared job's blocking half in a worker thread, then its apply (or abort)."""
    start = time.perf_counter()
    try:
        await trio.to_thread.run_sync(job.run)
    except BaseException:
        job.abort()
        raise
    _counted(job, start)
    job.apply()
    return job


def _counted(job: Job, start: float) -> None:
    """A fold (a job that holds a slot) run since `start`, into the metrics."""
    if job.slot and metrics.counts is not None:
        metrics.counts.fold(job.stored_bytes, time.perf_counter() - start)


async def _flush_locked(view: RwView) -> None:
    """A flush with the view's lock held (after the sync running beside writes, if any:
    syncs are made durable in the order they were captured)."""
    held = lock(view)
    while held.syncing is not None:
        await held.syncing.wait()
    job = view.prepare_flush()
    if job is not None:
        await _run(job)


async def flush(view: RwView) -> None:
    """Make every change the view buffers durable (fsync: one flush covers all). Where
    all there is to sync is a block volume's written upper file (prepare_sync), the
    lock is let go while it runs: a sync waits for the disk (an fdatasync of what the
    last seconds wrote, hundreds of ms), and writers held behind it stalled the disk's
    guest meanwhile. One such sync at a time; a flush that finds one running waits for
    it, then captures what came after."""
    held = lock(view)
    while True:
        while held.syncing is not None:
            await held.syncing.wait()
        async with held:
            if held.syncing is not None:
                continue  # (another started while this waited for the lock)
            job = view.prepare_sync()
            if job is None:
                await _flush_locked(view)
                return
            done = held.syncing = trio.Event()
        break
    try:
        await _run(job)
    finally:
        held.syncing = None
        done.set()


async def sync(view: View) -> None:
    """fsync of any view: a read/write one flushes, an immutable one has nothing to do."""
    if view.rw is not None:
        await flush(view.rw)


async def take_snapshot(view: RwView, label: str | None) -> SnapshotNo:
    """flush, then the kind's snapshot: a freeze (O(1): a block volume's written epoch
    becomes the snapshot, folded into blobs later by fold_frozen), or a fold (a job
    with `slot`). A fold waits for a store job slot first, and only then takes the
    lock: writers are not stalled behind other processes' imports, only behind the
    fold. So a fold prepared without the slot is let go (abort), and prepared again
    once the slot is held."""
    async with lock(view):
        view.ensure_writable()  # a snapshot changes the volume: this mount claims it
        await _flush_locked(view)
        job = view.prepare_snapshot(label)
        if not job.slot:
            return (await _run(job)).snapshot
        job.abort()
    async with _fold_lock(view):
        await _fold_frozen_locked(view)  # what was frozen before comes first
        slot = await trio.to_thread.run_sync(acquire_slot, view.repo, f"{job.what} {view.name}")
        try:
            async with lock(view):
                await _flush_locked(view)
                return (await _run(view.prepare_snapshot(label))).snapshot
        finally:
            slot.release()


_fold_locks: WeakKeyDictionary[RwView, trio.Lock] = WeakKeyDictionary()


def _fold_lock(view: RwView) -> trio.Lock:
    """Held while a view's frozen epochs are folded: one fold at a time, in order."""
    held = _fold_locks.get(view)
    if held is None:
        held = _fold_locks[view] = trio.Lock()
    return held


async def fold_frozen(view: RwView) -> None:
    """Fold the view's frozen epochs into blobs, oldest first (the daemon's fold task).
    Writes go on meanwhile: the view's lock is taken only to apply each result."""
    async with _fold_lock(view):
        await _fold_frozen_locked(view)


async def _fold_frozen_locked(view: RwView) -> None:
    while True:
        job = view.prepare_background_fold()
        if job is None:
            return
        # Shielded: a fold whose commit went through must be applied to the view even if
        # the daemon is stopping (its close folds what is left, and must see this one done).
        with trio.CancelScope(shield=True):
            slot = await trio.to_thread.run_sync(acquire_slot, view.repo, f"{job.what} {view.name}")
            start = time.perf_counter()
            try:
                await trio.to_thread.run_sync(job.run)
            except BaseException:
                job.abort()
                raise
            finally:
                slot.release()
            _counted(job, start)
            async with lock(view):
                job.apply()


async def flush_aged(views: Sequence[RwView], age_s: float) -> None:
    """Flush read/write views whose oldest unflushed change is older than age_s (the
    daemon's timer)."""
    now = time.monotonic()
    for rw in views:
        if rw.dirty_since is None or now - rw.dirty_since < age_s:
            continue
        try:
            await flush(rw)
        except OSError as e:
            # Still buffered, retried after age_s; fsync reports it to the application.
            log.warning("flushing %s failed, will retry: %s", rw.describe(ROOT_INO), e)
