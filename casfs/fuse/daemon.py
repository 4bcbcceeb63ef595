"""`casfs mount` and `casfs umount`: the daemon's lifetime and its run files.

The daemon is one trio run: an AsyncExitStack owns what it opened (catalog
connections, the chunk cache, volume claims, the FUSE session) and tears it down in
reverse on every path; one nursery runs the FUSE main loop beside a signal watcher
and the readiness check. Signals: SIGTERM and SIGINT unmount cleanly (as
`fusermount3 -u` does); SIGUSR1 dumps every thread's stack to the log.

The clean path, whichever way the unmount came: the main loop returns, every
read/write view is closed with a snapshot (a changed volume gets snapshot n+1), claims
are released (phase mounted -> ready), and STORE/run/<key>.json records the pid and
the snapshots taken, which `casfs umount` prints once the daemon has exited.

Background mode (the default) starts `python -m casfs.fuse.daemon` in a new session
with a ready pipe, and returns only when the mount answers, or with the daemon's
one-line error.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import errno
import faulthandler
import functools
import hashlib
import json
import logging
import os
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from casfs import volumes
from casfs.catalog import transaction
from casfs.catalog import volumes as rows
from casfs.errors import Busy, CasfsError, NotFound, UsageError
from casfs.fuse import rwsession
from casfs.fuse.control import CatalogWriter, ControlPlane, maybe_await, syncfs_path
from casfs.fuse.inodes import InodeTable
from casfs.fuse.operations import MountOptions, Operations
from casfs.lifecycle.claims import claim_volume, release_volume
from casfs.lifecycle.pids import alive
from casfs.lifecycle.recovery import recover
from casfs.repo import Repository, store_path
from casfs.store.ids import BlobId
from casfs.vfs.api import ROOT_INO, View
from casfs.vfs.chunks import DEFAULT_CACHE_BYTES, ChunkCache
from casfs.vfs.storeview import OpenRw, StoreView, Subject, static_view
from casfs.vfs.volume import VolumeView, open_volume

log = logging.getLogger("casfs.daemon")

FSTYPE = "fuse.casfs"
READY_TIMEOUT_S = 60.0
UMOUNT_TIMEOUT_S = 300.0
ENV_TEST_TIMEOUTS = "CASFS_TEST_TIMEOUTS"
# Buffered writes older than this are flushed by the timer (checked every tick).
DIRTY_AGE_S = 5.0
FLUSH_TICK_S = 1.0
ENV_CACHE_MB = "CASFS_CHUNK_CACHE_MB"
_M_ARENA_MAX = -8  # mallopt parameter (malloc.h)


@dataclass
class Config:
    store: Path
    mountpoint: str  # absolute, not resolved through a possibly hung mount
    volume: str | None = None
    read_only: bool = False
    allow_other: bool = False
    zero_timeouts: bool = False
    ready_fd: int | None = None
    cache_bytes: int = DEFAULT_CACHE_BYTES


@dataclass
class _Mounted:
    """What the serving daemon holds, for the teardown."""

    held: set[str] = field(default_factory=set)  # volumes claimed read/write
    rw_views: dict[str, View] = field(default_factory=dict)
    clean: bool = False  # the main loop ended by an unmount, not an error
    snapshots: list[str] = field(default_factory=list)
    unsaved: dict[str, dict[str, Any]] = field(default_factory=dict)  # volume -> what it lost

    async def flush_all(self) -> None:
        """Save every read/write view (the first error is raised, after trying all)."""
        failed: OSError | None = None
        for view in list(self.rw_views.values()):
            try:
                await rwsession.sync(view)
            except OSError as e:
                failed = failed or e
        if failed is not None:
            raise failed


# -- entry points ------------------------------------------------------------------


def mount_main(args: argparse.Namespace) -> int:
    cfg = _config(args)
    if getattr(args, "foreground", False):
        _warn_unsaved(cfg)
        return run_daemon(cfg)
    rc = _spawn(cfg)
    if rc == 0:
        _warn_unsaved(cfg)
    return rc


def _warn_unsaved(cfg: Config) -> None:
    """Say so when a volume's last read/write mount ended without saving everything."""
    repo = Repository.open(cfg.store)
    try:
        infos = [volumes.get_volume(repo, cfg.volume)] if cfg.volume else volumes.list_volumes(repo)
    finally:
        repo.close()
    for info in infos:
        if info.unsaved:
            what = volumes.describe_unsaved(info.unsaved)
            print(f"casfs: warning: volume {info.name}: {what}", file=sys.stderr)


def umount_main(args: argparse.Namespace) -> int:
    mountpoint = os.path.abspath(args.mountpoint)
    entry = find_mount(mountpoint)
    if entry is None or entry.fstype != FSTYPE:
        raise NotFound(f"{mountpoint} is not a casfs mount")
    store = Path(entry.source.removeprefix("casfs:"))
    run_file = run_path(store, mountpoint)
    before = _read_json(run_file)
    pid = int(before["pid"]) if before and before.get("state") == "mounted" else None
    if before is not None and not before.get("read_only", True):
        _save_before_unmount(mountpoint)
    try:
        done = subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise Busy(f"unmounting {mountpoint} timed out") from None
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"status {done.returncode}"
        raise Busy(f"cannot unmount {mountpoint}: {why}")
    if pid is None:
        return 0
    timeout = float(getattr(args, "timeout", None) or UMOUNT_TIMEOUT_S)
    if not wait_pid_gone(pid, timeout):
        raise Busy(f"unmounted {mountpoint}, but its daemon (pid {pid}) is busy after {timeout:.0f} s")
    after = _read_json(run_file) or {}
    for snap in after.get("snapshots", []):
        print(f"snapshot {snap}")
    where = log_path(store, mountpoint)
    if after.get("pid") != pid or after.get("state") != "exited":
        raise CasfsError(f"the daemon of {mountpoint} (pid {pid}) did not finish cleanly; see {where}")
    if not after.get("clean", False):
        lost = ", ".join(after.get("unsaved", [])) or "some volumes"
        raise CasfsError(f"{mountpoint} unmounted, but changes to {lost} could not be saved; see {where}")
    return 0


def _save_before_unmount(mountpoint: str) -> None:
    """Ask the daemon to save everything it buffers; if it cannot, refuse to unmount
    (as umount(8) refuses a busy filesystem): unmounting would throw the data away."""
    try:
        os.setxattr(mountpoint, "user.casfs.flush", b"")
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return  # a daemon from before the flush control: its unmount flushes as it can
        why = os.strerror(e.errno or errno.EIO)
        raise CasfsError(
            f"not unmounting {mountpoint}: saving its buffered writes failed: {why}; "
            "it stays mounted and nothing is lost (free space in the store, then run casfs umount again)"
        ) from None


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
        return trio.run(_serve, cfg)
    except CasfsError as e:
        _fail(cfg, e.exit_code, str(e))
        return e.exit_code
    except Exception as e:
        log.exception("the daemon failed")
        _fail(cfg, 1, f"{type(e).__name__}: {e}")
        return 1


def _one_malloc_arena() -> None:
    """glibc gives each thread that allocates its own arena and keeps freed chunks
    there: with read-ahead threads allocating 64 KiB chunks, resident memory grew to
    3x the chunk cache (822 MB for a 256 MiB cache). One arena keeps it near cache + 50 MB."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(_M_ARENA_MAX, 1)


# -- configuration ----------------------------------------------------------------


def _config(args: argparse.Namespace) -> Config:
    store = getattr(args, "store_path", None) or store_path(getattr(args, "store", None))
    cache_mb = os.environ.get(ENV_CACHE_MB)
    return Config(
        store=Path(os.path.abspath(store)),
        mountpoint=os.path.abspath(args.mountpoint),
        volume=getattr(args, "volume", None),
        read_only=bool(getattr(args, "ro", False)),
        allow_other=bool(getattr(args, "allow_other", False)),
        zero_timeouts=bool(getattr(args, "zero_timeouts", False)) or os.environ.get(ENV_TEST_TIMEOUTS) == "0",
        ready_fd=getattr(args, "ready_fd", None),
        cache_bytes=int(cache_mb) << 20 if cache_mb else DEFAULT_CACHE_BYTES,
    )


def _fuse_options(cfg: Config) -> set[str]:
    # libfuse splits options at commas; a backslash escapes one.
    fsname = f"casfs:{cfg.store}".replace("\\", "\\\\").replace(",", "\\,")
    opts = {f"fsname={fsname}", "subtype=casfs", "default_permissions"}
    if cfg.allow_other:
        opts.add("allow_other")
    if cfg.read_only:
        opts.add("ro")
    return opts


# -- serving -----------------------------------------------------------------------


async def _serve(cfg: Config) -> int:
    # Before anything else, so that a signal during start-up is not a kill.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        existing = find_mount(cfg.mountpoint)
        if existing is not None and existing.fstype == FSTYPE:
            raise Busy(f"{cfg.mountpoint} is already a casfs mount ({existing.source})")
        async with contextlib.AsyncExitStack() as stack:
            repo = Repository.open(cfg.store)
            stack.callback(repo.close)
            for message in recover(repo):
                log.warning("recovered: %s", message)
            writer = CatalogWriter(cfg.store)
            stack.callback(writer.close)
            chunks = ChunkCache(repo.get, cfg.cache_bytes, get_nowait=repo.get_if_cached)
            stack.callback(chunks.close)
            repo.on_corrupt = chunks.count_corrupt  # trees and maps count as data chunks do
            mounted = _Mounted()
            stack.push_async_callback(_release_claims, writer, mounted)
            stack.push_async_callback(_close_views, mounted)
            root, subject = _root_view(cfg, repo, chunks, mounted)
            controls = ControlPlane(repo, writer, chunks, cfg.mountpoint, os.getuid(), mounted.held)
            controls.flush_all = mounted.flush_all
            options = MountOptions(cfg.mountpoint, str(cfg.store), cfg.read_only, owner_uid=os.getuid())
            if cfg.zero_timeouts:
                options.immutable_timeout = options.mutable_timeout = 0.0
            ops = Operations(InodeTable(root), chunks, controls, options, subject)
            # The kernel's writeback cache owns a regular file's size and mtime once the
            # inode exists, and the root inode exists before any getattr: a block volume
            # mounted on a file would show size 0 for ever. Off there, and where nothing writes.
            ops.enable_writeback_cache = not cfg.read_only and not _is_file(root)
            pyfuse3.init(ops, cfg.mountpoint, _fuse_options(cfg))
            stack.callback(_close_session, cfg.mountpoint)
            log.info("mounted %s on %s", cfg.volume or cfg.store, cfg.mountpoint)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_signals, signals, cfg.mountpoint)
                nursery.start_soon(_announce_ready, cfg)
                nursery.start_soon(_flush_timer, ops, mounted)
                await pyfuse3.main()
                nursery.cancel_scope.cancel()
            # Only the clean path snapshots (the exit stack closes the views).
            mounted.clean = True
    saved = not mounted.unsaved
    lost = sorted(mounted.unsaved)
    _write_run_file(cfg, {"state": "exited", "clean": saved, "snapshots": mounted.snapshots, "unsaved": lost})
    log.info("unmounted %s%s", cfg.mountpoint, "".join(f"; snapshot {s}" for s in mounted.snapshots))
    return 0 if saved else 1


def _root_view(
    cfg: Config, repo: Repository, chunks: ChunkCache, mounted: _Mounted
) -> tuple[View, Callable[[View], Subject | None]]:
    try:
        mode = os.stat(cfg.mountpoint).st_mode
    except FileNotFoundError:
        raise NotFound(f"mount point {cfg.mountpoint} does not exist") from None
    if cfg.volume is None:
        if not stat.S_ISDIR(mode):
            raise UsageError(f"{cfg.mountpoint} is not a directory (a whole store mounts on a directory)")
        store_view = StoreView(repo, None if cfg.read_only else _rw_opener(repo, chunks, mounted, lazy=True))
        return store_view, store_view.subject
    info = volumes.get_volume(repo, cfg.volume)
    if info.kind == "dir" and not stat.S_ISDIR(mode):
        raise UsageError(f"volume {cfg.volume!r} is a directory volume: mount it on a directory")
    if info.kind == "block" and not stat.S_ISREG(mode):
        raise UsageError(f"volume {cfg.volume!r} is a block volume: mount it on a regular file (touch one)")
    subject = Subject("volume", cfg.volume)
    view: View | None = None
    if info.mode == "rw" and not cfg.read_only:
        claim_volume(repo, cfg.volume)
        mounted.held.add(cfg.volume)
        view = _rw_opener(repo, chunks, mounted)(cfg.volume)
    if view is None:
        with transaction(repo.conn):
            rows.touch(repo.conn, cfg.volume)  # a read-only mount is a use too (ephemeral volumes)
        view = static_view(
            repo,
            info.kind,
            BlobId(bytes.fromhex(info.base)),
            info.chunk_size,
            2,
            info.created,
            "",
            block_mode=0o444 if info.mode == "ro" or cfg.read_only else 0o644,
        )
    root = view
    return root, lambda v: subject if v is root else None


def _is_file(view: View) -> bool:
    return stat.S_ISREG(view.getattr(ROOT_INO).mode)


def _rw_opener(repo: Repository, chunks: ChunkCache, mounted: _Mounted, lazy: bool = False) -> OpenRw:
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


async def _watch_signals(signals: Any, mountpoint: str) -> None:
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


async def _announce_ready(cfg: Config) -> None:
    # The stat goes through our own main loop: once it returns, the mount answers.
    with trio.fail_after(READY_TIMEOUT_S):
        await trio.to_thread.run_sync(os.stat, cfg.mountpoint)
    _write_run_file(cfg, {"state": "mounted"})
    if cfg.ready_fd is not None:
        with contextlib.suppress(OSError):
            os.write(cfg.ready_fd, b"ready\n")
            os.close(cfg.ready_fd)
        cfg.ready_fd = None


async def _close_views(mounted: _Mounted) -> None:
    for name, view in mounted.rw_views.items():
        closer = getattr(view, "close", None)
        if closer is None:
            continue
        if mounted.clean and isinstance(view, VolumeView) and not view.claimed and view.overlay:
            # Read here, never changed, but a crashed mount left an overlay: fold it now,
            # as the unmount of the mount that made it would have, if no one else holds it.
            try:
                view.ensure_writable()
            except CasfsError as e:
                log.info("volume %s: its overlay stays for its next user: %s", name, e)
        try:
            n = await maybe_await(closer(snapshot=mounted.clean))
        except Exception as e:
            _record_unsaved(mounted, name, view, e)
            continue
        if n is not None:
            mounted.snapshots.append(f"{name}@{n}")


def _record_unsaved(mounted: _Mounted, name: str, view: View, error: Exception) -> None:
    """The last flush failed as the mount ended: say exactly what is lost, in the log
    now and on the volume (the next mount and `casfs volume info` show it)."""
    unsaved = view.unsaved() if hasattr(view, "unsaved") else []
    log.error("volume %s: the final flush failed, changes NOT saved: %s", name, error)
    for path, size in unsaved:
        log.error("volume %s: not saved: %s (%d buffered bytes)", name, path, size)
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
    pyfuse3.close(unmount=entry is not None and entry.fstype == FSTYPE)


def _fail(cfg: Config, code: int, message: str) -> None:
    message = " ".join(message.split())
    if cfg.ready_fd is not None:
        with contextlib.suppress(OSError):
            os.write(cfg.ready_fd, f"error {code} {message}\n".encode())
            os.close(cfg.ready_fd)
        cfg.ready_fd = None
    print(f"casfs: error: {message}", file=sys.stderr)


def wait_pid_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- /proc/self/mountinfo ------------------------------------------------------------


@dataclass(frozen=True)
class MountEntry:
    mount_id: int
    device: str  # major:minor; for FUSE the minor names /sys/fs/fuse/connections/<minor>
    mountpoint: str
    fstype: str
    source: str


def _unescape(text: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def mounts() -> list[MountEntry]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            rest = right.split()
            if len(fields) < 5 or len(rest) < 2:
                continue
            point, source = _unescape(fields[4]), _unescape(rest[1])
            out.append(MountEntry(int(fields[0]), fields[2], point, rest[0], source))
    return out


def find_mount(mountpoint: str) -> MountEntry | None:
    """The topmost mount at exactly this path (never stats it: it may be hung)."""
    found = None
    for entry in mounts():
        if entry.mountpoint == mountpoint:
            found = entry
    return found


# -- run files -------------------------------------------------------------------------


def _key(mountpoint: str) -> str:
    return hashlib.sha256(mountpoint.encode()).hexdigest()[:20]


def run_path(store: Path, mountpoint: str) -> Path:
    return store / "run" / f"{_key(mountpoint)}.json"


def log_path(store: Path, mountpoint: str) -> Path:
    return store / "run" / f"{_key(mountpoint)}.log"


def _write_run_file(cfg: Config, extra: dict[str, Any]) -> None:
    path = run_path(cfg.store, cfg.mountpoint)
    path.parent.mkdir(exist_ok=True)
    record = {
        "pid": os.getpid(),
        "mountpoint": cfg.mountpoint,
        "store": str(cfg.store),
        "volume": cfg.volume,
        "read_only": cfg.read_only,
        "time": time.time(),
        **extra,
    }
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


# -- background mode --------------------------------------------------------------------


def _spawn(cfg: Config) -> int:
    run_dir = cfg.store / "run"
    if not cfg.store.joinpath("catalog.db").exists():
        raise NotFound(f"no casfs store at {cfg.store} (create one with `casfs init`)")
    run_dir.mkdir(exist_ok=True)
    logfile = log_path(cfg.store, cfg.mountpoint)
    r, w = os.pipe()
    cmd = [sys.executable, "-m", "casfs.fuse.daemon", "--store", str(cfg.store), "--ready-fd", str(w)]
    cmd += ["--volume", cfg.volume] if cfg.volume else []
    cmd += ["--ro"] if cfg.read_only else []
    cmd += ["--allow-other"] if cfg.allow_other else []
    cmd += ["--zero-timeouts"] if cfg.zero_timeouts else []
    cmd += ["--", cfg.mountpoint]
    env = dict(os.environ, **{ENV_CACHE_MB: str(cfg.cache_bytes >> 20)})
    try:
        with open(logfile, "ab") as log_out:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_out,
                stderr=log_out,
                pass_fds=(w,),
                start_new_session=True,
                env=env,
            )
    finally:
        os.close(w)
    try:
        line = _read_line(r, READY_TIMEOUT_S)
    finally:
        os.close(r)
    if line.startswith("ready"):
        return 0
    if line.startswith("error "):
        _, code, message = [*line.rstrip("\n").split(" ", 2), ""][:3]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        _error(message)
        return int(code) if code.isdigit() else 1
    if proc.poll() is None:
        proc.terminate()  # it never answered: end the daemon we started
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        _error(f"the mount did not answer within {READY_TIMEOUT_S:.0f} s; see {logfile}")
        return 1
    _error(f"the mount daemon exited with status {proc.returncode}; see {logfile}")
    return 1


def _error(message: str) -> None:
    print(f"casfs: error: {message}", file=sys.stderr)


def _read_line(fd: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        part = os.read(fd, 4096)
        if not part:
            break
        data += part
    return data.decode(errors="replace")


# -- python -m casfs.fuse.daemon ---------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m casfs.fuse.daemon", description="the casfs mount daemon")
    p.add_argument("--store", "-s", default=None)
    p.add_argument("--volume", default=None)
    p.add_argument("--ro", action="store_true")
    p.add_argument("--allow-other", action="store_true")
    p.add_argument("--zero-timeouts", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ready-fd", type=int, default=None, help="write 'ready' or 'error CODE MESSAGE' here")
    p.add_argument("mountpoint")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = _config(args)
    except CasfsError as e:
        print(f"casfs: error: {e}", file=sys.stderr)
        if args.ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(args.ready_fd, f"error {e.exit_code} {e}\n".encode())
        return e.exit_code
    return run_daemon(cfg)


if __name__ == "__main__":
    sys.exit(main())
