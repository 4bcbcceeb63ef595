"""`casfs mount`'s daemon: serve(cfg), the mount's whole lifetime, and nothing else.

The daemon is one trio run: an AsyncExitStack owns what it opened (catalog
connections, the chunk cache, volume claims, the FUSE session) and tears it down in
reverse on every path; one nursery runs the FUSE main loop beside a signal watcher,
the readiness check and the write-back timer. Signals: SIGTERM and SIGINT unmount
cleanly (as `fusermount3 -u` does); SIGUSR1 dumps every thread's stack to the log.

The clean path, whichever way the unmount came: the main loop returns, every
read/write view is closed with a snapshot (a changed volume gets snapshot n+1), claims
are released (phase mounted -> ready), and STORE/run/<key>.json records the pid and
the snapshots taken, which `casfs umount` prints once the daemon has exited.

Starting it (in the background, with a ready pipe), its run files and `casfs umount`
are the launcher's (casfs.fuse.launcher); `python -m casfs.fuse.daemon` is what the
launcher starts; a foreground mount (`casfs mount --foreground`) calls run_daemon.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import functools
import logging
import os
import select
import signal
import stat
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyfuse3
import trio

from casfs import metrics, volumes
from casfs.catalog import transaction
from casfs.catalog import volumes as rows
from casfs.errors import Busy, CasfsError, NotFound, Stale, UsageError, of_database
from casfs.fuse import fastwait, launcher, passthrough, rwsession
from casfs.fuse.control import CatalogWriter, ControlPlane, syncfs_path
from casfs.fuse.inodes import InodeTable
from casfs.fuse.launcher import Config
from casfs.fuse.mountinfo import find_mount
from casfs.fuse.operations import MountOptions, Operations
from casfs.ids import FIRST_FREE_INO
from casfs.kinds import VolumeKind
from casfs.lifecycle.claims import claim_volume, release_volume
from casfs.repo import Repository
from casfs.store import BlobStore
from casfs.store.filecache import FileCache, cache_root, limits_from_env
from casfs.store.filefill import GetMany
from casfs.store.ids import BlobId
from casfs.store.reserve import free_bytes
from casfs.upkeep import scheduled
from casfs.upkeep.recovery import recover
from casfs.vfs.api import ROOT_INO, View
from casfs.vfs.chunks import DEFAULT_CACHE_BYTES, ChunkCache
from casfs.vfs.storeview import VOLUMES_INO, OpenRw, StoreView, Subject, static_view
from casfs.vfs.volume import Volume, open_volume

log = logging.getLogger("casfs.daemon")

# Buffered writes older than this are flushed by the timer (checked every tick).
DIRTY_AGE_S = 5.0
FLUSH_TICK_S = 1.0
FOLD_TICK_S = 0.2
FOLD_RETRY_S = 5.0
_SCRUB_CHECK_S = 60.0  # how often the scheduled scrub is looked at (casfs.upkeep.scheduled)
# The kernel's read-ahead for this mount, KiB (its default, 128, cut a sequential read
# into 128 KiB requests; 1 MiB measured 1.5x on a cold 1 MiB sequential read).
READ_AHEAD_KB = 1024
_M_ARENA_MAX = -8  # mallopt parameter (malloc.h)
# pyfuse3's request tasks kept waiting for requests: with its default (1), a task ends
# whenever another is idle and a new one is spawned for the next burst, a task's start
# and end per request under a queue depth of 16 (a hypervisor's).
SERVING_TASKS = 32


@dataclass
class _Mounted:
    """What the serving daemon holds, for the teardown."""

    held: set[str] = field(default_factory=set)  # volumes claimed read/write
    rw_views: dict[str, Volume] = field(default_factory=dict)
    clean: bool = False  # the main loop ended by an unmount, not an error
    snapshots: list[str] = field(default_factory=list)
    unsaved: dict[str, dict[str, object]] = field(default_factory=dict)  # volume -> what it lost
    unsnapshotted: list[str] = field(default_factory=list)  # saved, but the unmount's snapshot failed

    async def flush_all(self) -> None:
        """Save every read/write view (the first error is raised, after trying all)."""
        failed: OSError | None = None
        for view in list(self.rw_views.values()):
            try:
                await rwsession.flush(view)
            except OSError as e:
                failed = failed or e
        if failed is not None:
            raise failed


# -- entry points ------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`python -m casfs.fuse.daemon` (launcher.daemon_command writes the command line)."""
    args = launcher.daemon_parser().parse_args(argv)
    try:
        cfg = launcher.config(args)
    except CasfsError as e:
        launcher.fail(args.ready_fd, e.exit_code, str(e))
        return e.exit_code
    return run_daemon(cfg)


def run_daemon(cfg: Config) -> int:
    """Serve in this process until unmounted; the exit status."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    _one_malloc_arena()
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO,
            stream=sys.stderr,
            format=f"%(asctime)s casfs[{os.getpid()}] %(levelname)s %(name)s: %(message)s",
        )
    try:
        return trio.run(serve, cfg)
    except CasfsError as e:
        _fail(cfg, e.exit_code, str(e))
        return e.exit_code
    except Exception as e:
        mapped = of_database(e, free_bytes(cfg.store) == 0)  # (a locked or full catalog: one line)
        if mapped is not None:
            _fail(cfg, mapped.exit_code, str(mapped))
            return mapped.exit_code
        log.exception("the daemon failed")
        _fail(cfg, 1, f"{type(e).__name__}: {e}")
        return 1


def _fail(cfg: Config, code: int, message: str) -> None:
    launcher.fail(cfg.ready_fd, code, message)
    cfg.ready_fd = None


def _one_malloc_arena() -> None:
    """glibc gives each thread that allocates its own arena and keeps freed chunks
    there: with read-ahead threads allocating 64 KiB chunks, resident memory grew to
    3x the chunk cache (822 MB for a 256 MiB cache). One arena keeps it near cache + 50 MB."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)  # (the process's own symbols: find_library forks ldconfig)
        libc.mallopt(_M_ARENA_MAX, 1)


def _fuse_idle() -> Callable[[], bool] | None:
    """A check that no FUSE request is queued in the kernel (the session's /dev/fuse
    polls readable while one is), for the chunk cache's blocking reads on the trio
    thread; None if the device is not found (pyfuse3 does not expose it)."""
    fd = fastwait.fuse_fd()
    if fd is None:
        log.info("no single /dev/fuse descriptor: misses are always read in workers")
        return None
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return lambda: not poller.poll(0)


def _fuse_options(cfg: Config) -> set[str]:
    # libfuse splits options at commas; a backslash escapes one.
    fsname = f"casfs:{cfg.store}".replace("\\", "\\\\").replace(",", "\\,")
    opts = {f"fsname={fsname}", "subtype=casfs", "default_permissions"}
    if cfg.allow_other:
        opts.add("allow_other")
    if cfg.suid:
        opts.add("suid")  # (libfuse mounts MS_NOSUID unless told)
    if cfg.read_only:
        opts.add("ro")
    return opts


# -- serving -----------------------------------------------------------------------


async def serve(cfg: Config) -> int:
    # Before anything else, so that a signal during start-up is not a kill.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        existing = find_mount(cfg.mountpoint)
        if existing is not None and existing.is_casfs:
            raise Busy(f"{cfg.mountpoint} is already a casfs mount ({existing.source})")
        async with contextlib.AsyncExitStack() as stack:
            repo = Repository.open(cfg.store)
            stack.callback(repo.close)
            repo.blobs.warm()  # (the pack index read ahead while recovery and the mount go on)
            for message in recover(repo):
                log.warning("recovered: %s", message)
            writer = CatalogWriter(cfg.store, repo.blobs)
            stack.callback(writer.close)
            cache_bytes = DEFAULT_CACHE_BYTES if cfg.cache_bytes is None else cfg.cache_bytes
            # The blobs are local files unless STORE/blobs.json names a bucket (Repository.open).
            local = not (cfg.store / "blobs.json").exists()
            get: Callable[[BlobId], bytes] = repo.get
            get_many: Callable[[Sequence[BlobId]], Iterator[tuple[BlobId, bytes | Exception]]]
            get_many = repo.get_many
            get_nowait: Callable[[BlobId], bytes | None] = repo.get_if_cached
            if cfg.metrics is not None:
                metrics.counts = metrics.Counts()
                get, get_many = metrics.counted_get(get), metrics.counted_get_many(get_many)
                get_nowait = metrics.counted_get(get_nowait)
            chunks = ChunkCache(get, cache_bytes, get_nowait=get_nowait, local=local, get_many=get_many)
            stack.callback(chunks.close)
            collector = None
            if cfg.metrics is not None:
                assert metrics.counts is not None
                gauges = metrics.store_gauges(str(cfg.store), repo.blobs, lambda: chunks.corrupt_reads)
                collector = metrics.CasfsCollector(cfg.mountpoint, metrics.counts, gauges)
                stack.callback(metrics.serve(metrics.parse_address(cfg.metrics), collector))
                log.info("metrics on http://%s:%d/metrics", *metrics.parse_address(cfg.metrics))
            repo.on_corrupt = chunks.count_corrupt  # trees and maps count as data chunks do
            mounted = _Mounted()
            stack.push_async_callback(_release_claims, writer, mounted)
            stack.callback(_close_views, mounted)
            root, subject = _root_view(cfg, repo, mounted)
            on_file = _is_file(root)
            controls = ControlPlane(repo, writer, chunks, cfg.mountpoint, os.getuid(), mounted.held, on_file)
            controls.flush_all = mounted.flush_all
            if isinstance(root, StoreView) and not cfg.read_only:
                controls.release_volume = functools.partial(_release_volume, root, writer, mounted)
            options = MountOptions(cfg.mountpoint, str(cfg.store), cfg.read_only, owner_uid=os.getuid())
            if cfg.zero_timeouts:
                options.immutable_timeout = options.mutable_timeout = 0.0
            ops = Operations(InodeTable(root), chunks, controls, options, subject)
            if collector is not None:  # (ops.passthrough is made at the kernel's INIT)
                collector.file_cache = lambda: ops.passthrough.figures() if ops.passthrough else None
            # The kernel's writeback cache owns a regular file's size and mtime once the
            # inode exists, and the root inode exists before any getattr: a block volume
            # mounted on a file would show size 0 for ever. Off there, and where nothing
            # writes; and where passthrough is asked for (the kernel has it only without
            # that cache: changed files are then written by the kernel, casfs.fuse.upperpass).
            why_not = passthrough.refusal(cfg.passthrough)
            ops.enable_passthrough = why_not is None  # (pyfuse3 asks the kernel at INIT)
            ops.enable_writeback_cache = not cfg.read_only and not on_file and not ops.enable_passthrough
            # (SB_NOSEC: no security.capability question before each write; casfs.fuse.killpriv)
            ops.enable_killpriv_v2 = ops.enable_passthrough and not cfg.read_only
            limit, open_fill_max = limits_from_env()
            files = FileCache(cache_root(cfg.store), limit)
            ops.on_init = functools.partial(
                _start_passthrough, ops, controls, files, repo.get, why_not, open_fill_max, _runs_of(chunks)
            )
            pyfuse3.init(ops, cfg.mountpoint, _fuse_options(cfg))
            stack.callback(_stop_fills, ops)
            stack.callback(_close_session, cfg.mountpoint)
            chunks.idle = _fuse_idle()
            log.info("mounted %s on %s", cfg.volume or cfg.store, cfg.mountpoint)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_signals, signals, cfg.mountpoint)
                nursery.start_soon(_announce_ready, cfg, repo)
                nursery.start_soon(_flush_timer, ops, mounted)
                nursery.start_soon(_fold_timer, mounted, root)
                nursery.start_soon(_scrub_timer, cfg.store, repo.blobs)
                with fastwait.installed():
                    await pyfuse3.main(min_tasks=SERVING_TASKS)
                nursery.cancel_scope.cancel()
            # Only the clean path snapshots (the exit stack closes the views).
            mounted.clean = True
    saved = not mounted.unsaved
    lost = sorted(mounted.unsaved)
    record: launcher.RunRecord = {
        "state": "exited",
        "clean": saved,
        "snapshots": mounted.snapshots,
        "unsaved": lost,
        "unsnapshotted": sorted(mounted.unsnapshotted),
    }
    launcher.write_run_file(cfg, record)
    log.info("unmounted %s%s", cfg.mountpoint, "".join(f"; snapshot {s}" for s in mounted.snapshots))
    return 0 if saved and not mounted.unsnapshotted else 1


def _start_passthrough(
    ops: Operations,
    controls: ControlPlane,
    files: FileCache,
    fetch: Callable[[BlobId], bytes],
    why_not: str | None,
    open_fill_max: int,
    fetch_many: GetMany,
) -> None:
    """At the kernel's INIT: passthrough where it was asked for and granted (its mode is
    then logged at the first use), else why not, logged now."""
    if why_not is None and not pyfuse3.passthrough_granted:
        why_not = "the kernel does not offer passthrough"
    if why_not is None:
        ops.passthrough = passthrough.PassthroughOpens(files, fetch, open_fill_max, fetch_many)
        controls.passthrough_mode = ops.passthrough.mode
        controls.file_cache_status = ops.passthrough.status
        return
    controls.passthrough_mode = lambda: f"off: {why_not}"
    log.info("passthrough off: %s", why_not)


def _runs_of(chunks: ChunkCache) -> GetMany:
    """Passthrough's background fills read through the daemon's chunk cache: a first
    reader of the file beside its fill (served by the daemon) and the fill decode each
    chunk once between them, whichever is ahead (the reader behind reads the fill's file)."""

    def get_many(bids: Sequence[BlobId]) -> Iterator[tuple[BlobId, bytes | Exception]]:
        return iter(chunks.fetch_many(bids).items())

    return get_many


def _stop_fills(ops: Operations) -> None:
    if ops.passthrough is not None:
        ops.passthrough.fills.stop()


def _root_view(
    cfg: Config, repo: Repository, mounted: _Mounted
) -> tuple[View, Callable[[View], Subject | None]]:
    try:
        mode = os.stat(cfg.mountpoint).st_mode
    except FileNotFoundError:
        raise NotFound(f"mount point {cfg.mountpoint} does not exist") from None
    if cfg.volume is None:
        if not stat.S_ISDIR(mode):
            raise UsageError(f"{cfg.mountpoint} is not a directory (a whole store mounts on a directory)")
        store_view = StoreView(repo, None if cfg.read_only else _rw_opener(repo, mounted, lazy=True))
        return store_view, store_view.subject
    info = volumes.get_volume(repo, cfg.volume)
    if info.kind == VolumeKind.DIR and not stat.S_ISDIR(mode):
        raise UsageError(f"volume {cfg.volume!r} is a directory volume: mount it on a directory")
    if info.kind == VolumeKind.BLOCK and not stat.S_ISREG(mode):
        raise UsageError(f"volume {cfg.volume!r} is a block volume: mount it on a regular file (touch one)")
    subject = Subject("volume", cfg.volume)
    view: View
    if info.mode == "rw" and not cfg.read_only:
        claim_volume(repo, cfg.volume)
        mounted.held.add(cfg.volume)
        view = _rw_opener(repo, mounted)(cfg.volume)
    else:
        with transaction(repo.conn):
            rows.touch(repo.conn, cfg.volume)  # a read-only mount is a use too (ephemeral volumes)
        view = static_view(
            repo,
            info.kind,
            BlobId(bytes.fromhex(info.base)),
            info.chunk_size,
            FIRST_FREE_INO,
            info.created,
            "",
            block_mode=0o444 if info.mode == "ro" or cfg.read_only else 0o644,
        )
    return view, lambda v: subject if v is view else None


def _is_file(view: View) -> bool:
    return stat.S_ISREG(view.getattr(ROOT_INO).mode)


def _rw_opener(repo: Repository, mounted: _Mounted, lazy: bool = False) -> OpenRw:
    """Makes the read/write view of a volume. `lazy` (a whole-store mount): the view
    claims its volume only at its first change, so browsing claims nothing."""

    def claim(name: str, expected: tuple[object, ...] | None = None) -> None:
        if name not in mounted.held:
            claim_volume(repo, name, expected)
            mounted.held.add(name)

    def open_rw(name: str) -> View:
        if not lazy:
            claim(name)
        view = open_volume(repo, name, claim=functools.partial(claim, name) if lazy else None)
        mounted.rw_views[name] = view
        return view

    return open_rw


async def _release_volume(store_view: StoreView, writer: CatalogWriter, mounted: _Mounted, name: str) -> None:
    """A whole-store mount lets go of volume `name` (user.casfs.release): its view
    flushed and closed without a snapshot (the overlay keeps what changed, for whoever
    snapshots it next), its claim released. A failed flush changes nothing (the view
    stays served and held). The old view stays the kernel's inodes' (views are never
    dropped while mounted) but refuses changes; the kernel's entry is dropped."""
    view = mounted.rw_views.get(name)
    if view is not None:
        await rwsession.flush(view)
        async with rwsession.lock(view):
            view.close(snapshot=False)
            view.claim = _released
        del mounted.rw_views[name]
    store_view.forget_rw(name)
    if name in mounted.held:
        await writer.run(functools.partial(release_volume, name=name))
        mounted.held.discard(name)
    # (the store view is the mount's root view: its inode numbers are the kernel's)
    entry = pyfuse3.FileNameT(name.encode())
    pyfuse3.invalidate_entry_async(pyfuse3.InodeT(VOLUMES_INO), entry, ignore_enoent=True)


def _released(generation: tuple[object, ...]) -> None:
    raise Stale("this mount released the volume: look it up again")


async def _watch_signals(signals: AsyncIterator[int], mountpoint: str) -> None:
    async for signum in signals:
        log.info("%s: unmounting %s", signal.Signals(signum).name, mountpoint)
        # A real unmount first: the kernel flushes its writeback cache through us.
        with trio.move_on_after(60):
            done = await trio.run_process(["fusermount3", "-u", mountpoint], check=False, capture_stderr=True)
            if done.returncode == 0:
                return
            log.warning("fusermount3 -u: %s", done.stderr.decode(errors="replace").strip())
        with contextlib.suppress(OSError), trio.move_on_after(30):
            await trio.to_thread.run_sync(syncfs_path, mountpoint)
        pyfuse3.terminate()  # the session is closed (detaching the mount) on the way out
        return


async def _flush_timer(ops: Operations, mounted: _Mounted) -> None:
    """Write-back by age: a change is made durable within about DIRTY_AGE_S even if
    nothing calls fsync (memory pressure is the adapter's, per write)."""
    while True:
        await trio.sleep(FLUSH_TICK_S)
        try:
            await ops.flush_aged(list(mounted.rw_views.values()), DIRTY_AGE_S)
        except Exception:
            log.exception("timed flush")


async def _fold_timer(mounted: _Mounted, root: View) -> None:
    """Background folds: snapshots a block volume froze (and those a crashed daemon
    left frozen) become blobs here, while writes go on; after a failure (a full disk)
    the fold waits FOLD_RETRY_S and tries again, the snapshot staying frozen, durable.
    A whole-store mount's views of frozen snapshots let go of the files of those
    folded, here or by another process."""
    while True:
        await trio.sleep(FOLD_TICK_S)
        if isinstance(root, StoreView):
            try:
                root.release_folded()
            except Exception:
                log.exception("releasing folded snapshots' files")
        for view in list(mounted.rw_views.values()):
            try:
                await rwsession.fold_frozen(view)
            except Exception:
                log.exception("folding %s, will retry", view.describe(ROOT_INO))
                await trio.sleep(FOLD_RETRY_S)


async def _scrub_timer(store: Path, blobs: BlobStore) -> None:
    """The store's scheduled scrub (casfs.upkeep.scheduled), in a worker thread, with the
    daemon's blob store: looked at every _SCRUB_CHECK_S (sooner when it is due sooner);
    stopped, to resume at the next turn, when the daemon ends. A failure is logged and
    tried again at the next look: it never ends the mount."""
    stop = threading.Event()
    try:
        await trio.sleep(1.0)  # (not in the way of the mount's start)
        while True:
            try:
                wait = await _scheduled_scrub(store, blobs, stop)
            except Exception:
                log.exception("scheduled scrub failed")
                wait = None
            await trio.sleep(_SCRUB_CHECK_S if wait is None else min(max(wait, 1.0), _SCRUB_CHECK_S))
    finally:
        stop.set()


async def _scheduled_scrub(store: Path, blobs: BlobStore, stop: threading.Event) -> float | None:
    """Run the scheduled scrub if it is due; seconds until it is (None: off, or just run)."""
    wait = await trio.to_thread.run_sync(scheduled.seconds_until, store)
    if wait is None or wait > 0:
        return wait
    found = await trio.to_thread.run_sync(scheduled.run, store, stop, blobs, abandon_on_cancel=True)
    if found is not None:
        damaged = ", ".join(found["damaged"]) or "none"
        log.info("scheduled scrub: %d blobs re-hashed, damaged: %s", found["blobs"], damaged)
        if found["damaged"]:
            log.error("scheduled scrub found damage: `casfs scrub` says what holds it")
    return None


async def _announce_ready(cfg: Config, repo: Repository) -> None:
    # The stat goes through our own main loop: once it returns, the mount answers.
    with trio.fail_after(launcher.READY_TIMEOUT_S):
        st = await trio.to_thread.run_sync(os.stat, cfg.mountpoint)
    _widen_read_ahead(st.st_dev)
    launcher.write_run_file(cfg, {"state": "mounted"})
    warnings = launcher.unsaved_warnings(repo, cfg.volume) if cfg.ready_fd is not None else []
    launcher.tell_ready(cfg.ready_fd, warnings)
    cfg.ready_fd = None


def _widen_read_ahead(dev: int) -> None:
    """Raise the mount's read-ahead (its own backing device in sysfs) to READ_AHEAD_KB,
    where we may (root). After the session's INIT: the kernel lowers the setting to
    what INIT negotiated when it processes the reply, never afterwards."""
    path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
    try:
        with open(path, "r+") as f:
            if int(f.read()) < READ_AHEAD_KB:
                f.seek(0)
                f.write(str(READ_AHEAD_KB))
    except (OSError, ValueError) as e:
        log.debug("read-ahead stays the kernel's: %s", e)


def _close_views(mounted: _Mounted) -> None:
    for name, view in mounted.rw_views.items():
        if mounted.clean and not view.claimed and view.overlay:
            # Read here, never changed, but a crashed mount left an overlay: fold it now,
            # as the unmount of the mount that made it would have, if no one else holds it.
            try:
                view.ensure_writable()
            except CasfsError as e:
                log.info("volume %s: its overlay stays for its next user: %s", name, e)
        try:
            n = view.close(snapshot=mounted.clean)
        except Exception as e:
            _record_unsaved(mounted, name, view, e)
            continue
        if n is not None:
            mounted.snapshots.append(f"{name}@{n}")


def _record_unsaved(mounted: _Mounted, name: str, view: Volume, error: Exception) -> None:
    """The last flush or the snapshot failed as the mount ended. If the flush had
    committed, nothing is lost: the overlay holds every change, and whoever uses the
    volume next folds it into the snapshot. Otherwise say exactly what is lost, in the
    log now and on the volume (the next mount and `casfs volume info` show it)."""
    unsaved = view.unsaved()
    if not unsaved:
        log.error(
            "volume %s: the snapshot at unmount failed; every change is saved in its "
            "overlay, folded into a snapshot by its next mount or `casfs snapshot create`: %s",
            name,
            error,
        )
        mounted.unsnapshotted.append(name)
        return
    log.error("volume %s: the final flush failed, changes NOT saved: %s", name, error)
    for path, size in unsaved:
        log.error("volume %s: not saved: %s (%d bytes)", name, path, size)
    mounted.unsaved[name] = {"time": time.time(), "pid": os.getpid(), "error": str(error), "unsaved": unsaved}


async def _release_claims(writer: CatalogWriter, mounted: _Mounted) -> None:
    for name in sorted(mounted.held):
        note = mounted.unsaved.get(name)
        try:
            await writer.run(functools.partial(release_volume, name=name, unsaved=note))
        except Exception:
            log.exception("releasing volume %s", name)


def _close_session(mountpoint: str) -> None:
    # Still mounted when the loop ended on a signal or an error: detach it now.
    entry = find_mount(mountpoint)
    pyfuse3.close(unmount=entry is not None and entry.is_casfs)


if __name__ == "__main__":
    sys.exit(main())
