"""The client side of `casfs mount` and `casfs umount`: everything but the serving.

- the daemon's Config, from the CLI's arguments or the daemon's own command line
  (`python -m casfs.fuse.daemon`, which daemon_command() writes and daemon_parser() reads);
- background mode: start the daemon in a new session with a ready pipe, and return only
  once the mount answers, or with the daemon's one-line error (the pipe's protocol,
  both ends, is here: `ready`, or `error CODE MESSAGE`);
- the run files STORE/run/<key>.json (the daemon's pid, state and the snapshots its
  unmount took) and <key>.log (its output), <key> naming the mount point;
- `casfs umount`: save, unmount, wait for the daemon to exit, print its snapshots.

No trio and no pyfuse3 here: the serving daemon (casfs.fuse.daemon) imports this, and
passes itself in for a foreground mount.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict, cast

from casfs import volumes
from casfs.errors import Busy, CasfsError, NotFound, UsageError, error_of_exit_code
from casfs.fuse.mountinfo import find_mount
from casfs.lifecycle.pids import alive
from casfs.repo import Repository, store_path

READY_TIMEOUT_S = 60.0
UMOUNT_TIMEOUT_S = 300.0
ENV_TEST_TIMEOUTS = "CASFS_TEST_TIMEOUTS"
ENV_CACHE_MB = "CASFS_CHUNK_CACHE_MB"


@dataclass
class Config:
    store: Path
    mountpoint: str  # absolute, not resolved through a possibly hung mount
    volume: str | None = None
    read_only: bool = False
    allow_other: bool = False
    # setuid bits and file capabilities in effect at exec (a FUSE mount is nosuid
    # unless asked): a container's rootfs needs them, as overlayfs has them.
    suid: bool = False
    zero_timeouts: bool = False
    ready_fd: int | None = None
    cache_bytes: int | None = None  # None: the chunk cache's default
    passthrough: bool = True  # where the mount can have it (casfs.fuse.passthrough)
    metrics: str | None = None  # ADDR:PORT to serve Prometheus metrics on


def config(args: argparse.Namespace) -> Config:
    """From the CLI's arguments (`store_path` set) or the daemon's own (`store`)."""
    store = getattr(args, "store_path", None) or store_path(getattr(args, "store", None))
    cache_mb = os.environ.get(ENV_CACHE_MB)
    address = getattr(args, "metrics", None)
    if address is not None:
        from casfs.metrics import parse_address

        try:
            parse_address(address)
        except ValueError as e:
            raise UsageError(str(e)) from None
    return Config(
        store=Path(os.path.abspath(store)),
        mountpoint=os.path.abspath(args.mountpoint),
        volume=getattr(args, "volume", None),
        read_only=bool(getattr(args, "ro", False)),
        allow_other=bool(getattr(args, "allow_other", False)),
        suid=bool(getattr(args, "suid", False)),
        zero_timeouts=bool(getattr(args, "zero_timeouts", False)) or os.environ.get(ENV_TEST_TIMEOUTS) == "0",
        ready_fd=getattr(args, "ready_fd", None),
        cache_bytes=int(cache_mb) << 20 if cache_mb else None,
        passthrough=not getattr(args, "no_passthrough", False),
        metrics=getattr(args, "metrics", None),
    )


# -- casfs mount -------------------------------------------------------------------------


def mount_main(args: argparse.Namespace, serve: Callable[[Config], int]) -> int:
    """`casfs mount`: in the background (a daemon process), or with --foreground in this
    process by `serve` (the daemon's run_daemon); the exit status."""
    cfg = config(args)
    if getattr(args, "foreground", False):
        repo = Repository.open(cfg.store)
        try:
            _warn(unsaved_warnings(repo, cfg.volume))
        finally:
            repo.close()
        return serve(cfg)
    return _spawn(cfg)  # (the daemon's ready line carries the warnings: one store open)


def unsaved_warnings(repo: Repository, volume: str | None) -> list[str]:
    """What to say of volumes whose last read/write mount ended without saving everything."""
    infos = [volumes.get_volume(repo, volume)] if volume else volumes.list_volumes(repo)
    return [f"volume {i.name}: {volumes.describe_unsaved(i.unsaved)}" for i in infos if i.unsaved]


def _warn(warnings: list[str]) -> None:
    for w in warnings:
        print(f"casfs: warning: {w}", file=sys.stderr)


def daemon_command(cfg: Config, ready_fd: int) -> list[str]:
    """The daemon's command line (daemon_parser() reads it)."""
    cmd = [sys.executable, "-m", "casfs.fuse.daemon", "--store", str(cfg.store), "--ready-fd", str(ready_fd)]
    cmd += ["--volume", cfg.volume] if cfg.volume else []
    cmd += ["--ro"] if cfg.read_only else []
    cmd += ["--allow-other"] if cfg.allow_other else []
    cmd += ["--suid"] if cfg.suid else []
    cmd += ["--zero-timeouts"] if cfg.zero_timeouts else []
    cmd += [] if cfg.passthrough else ["--no-passthrough"]
    cmd += ["--metrics", cfg.metrics] if cfg.metrics else []
    return [*cmd, "--", cfg.mountpoint]


def daemon_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m casfs.fuse.daemon", description="the casfs mount daemon")
    p.add_argument("--store", "-s", default=None)
    p.add_argument("--volume", default=None)
    p.add_argument("--ro", action="store_true")
    p.add_argument("--allow-other", action="store_true")
    p.add_argument("--suid", action="store_true")
    p.add_argument("--zero-timeouts", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-passthrough", action="store_true")
    p.add_argument("--metrics", metavar="ADDR:PORT", default=None)
    p.add_argument("--ready-fd", type=int, default=None, help="write 'ready' or 'error CODE MESSAGE' here")
    p.add_argument("mountpoint")
    return p


def _spawn(cfg: Config) -> int:
    try:
        _warn(start_daemon(cfg))
    except CasfsError as e:
        _error(str(e))
        return e.exit_code
    return 0


def start_daemon(cfg: Config) -> list[str]:
    """Start the mount daemon in a new session (it outlives its caller) and return once
    the mount answers, with the warnings for the user; the daemon's refusal raised as the
    error of its exit code. (`casfs mount` and the CSI plugin's NodeStageVolume.)"""
    if not cfg.store.joinpath("catalog.db").exists():
        raise NotFound(f"no casfs store at {cfg.store} (create one with `casfs init`)")
    (cfg.store / "run").mkdir(exist_ok=True)
    logfile = log_path(cfg.store, cfg.mountpoint)
    r, w = os.pipe()
    env = dict(os.environ)
    if cfg.cache_bytes is not None:
        env[ENV_CACHE_MB] = str(cfg.cache_bytes >> 20)
    try:
        with open(logfile, "ab") as log_out:
            proc = subprocess.Popen(
                daemon_command(cfg, w),
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
        rest = line[len("ready") :].strip()
        warnings: list[str] = json.loads(rest) if rest else []
        return warnings
    if line.startswith("error "):
        _, code, message = [*line.rstrip("\n").split(" ", 2), ""][:3]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        raise error_of_exit_code(int(code) if code.isdigit() else 1, message)
    if proc.poll() is None:
        proc.terminate()  # it never answered: end the daemon we started
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        raise CasfsError(f"the mount did not answer within {READY_TIMEOUT_S:.0f} s; see {logfile}")
    raise CasfsError(f"the mount daemon exited with status {proc.returncode}; see {logfile}")


def _error(message: str) -> None:
    print(f"casfs: error: {message}", file=sys.stderr)


# -- the ready pipe ------------------------------------------------------------------------


def tell_ready(fd: int | None, warnings: list[str]) -> None:
    """The daemon's side, once the mount answers: `ready`, then the warnings for the
    user (a JSON list), if any."""
    _tell(fd, f"ready {json.dumps(warnings)}\n" if warnings else "ready\n")


def fail(fd: int | None, code: int, message: str) -> None:
    """The daemon's side when it cannot serve: the error, on the pipe and on stderr."""
    message = " ".join(message.split())
    _tell(fd, f"error {code} {message}\n")
    _error(message)


def _tell(fd: int | None, line: str) -> None:
    # One line, then the pipe is closed: the launcher reads no further.
    if fd is not None:
        with contextlib.suppress(OSError):
            os.write(fd, line.encode())
            os.close(fd)


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


# -- run files ---------------------------------------------------------------------------


def _key(mountpoint: str) -> str:
    return hashlib.sha256(mountpoint.encode()).hexdigest()[:20]


def run_path(store: Path, mountpoint: str) -> Path:
    return store / "run" / f"{_key(mountpoint)}.json"


def log_path(store: Path, mountpoint: str) -> Path:
    return store / "run" / f"{_key(mountpoint)}.log"


class RunRecord(TypedDict, total=False):
    """STORE/run/<key>.json: the daemon's record of itself, written as it answers and
    as it exits (`casfs umount` and upkeep.ephemeral reads it)."""

    pid: int
    mountpoint: str
    store: str
    volume: str | None
    read_only: bool
    time: float
    # The daemon's, not a catalog phase: a JSON field written and compared as is, hence a
    # Literal (not an enum to convert on every read).
    state: Literal["mounted", "exited"]
    clean: bool  # exited having saved every change
    snapshots: list[str]  # "volume@n", taken by the unmount
    unsaved: list[str]  # volumes whose changes could not be saved
    unsnapshotted: list[str]  # volumes saved whose snapshot at unmount failed
    metrics: str | None  # ADDR:PORT of its Prometheus metrics (--metrics), if any


def write_run_file(cfg: Config, extra: RunRecord) -> None:
    path = run_path(cfg.store, cfg.mountpoint)
    path.parent.mkdir(exist_ok=True)
    record = RunRecord(
        pid=os.getpid(),
        mountpoint=cfg.mountpoint,
        store=str(cfg.store),
        volume=cfg.volume,
        read_only=cfg.read_only,
        time=time.time(),
        metrics=cfg.metrics,
    )
    record.update(extra)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)


def running_mounts(store: Path) -> list[RunRecord]:
    """The run records of this store's daemons that are serving now."""
    found = []
    for path in sorted((store / "run").glob("*.json")):
        record = _read_run_file(path)
        if record is not None and record.get("state") == "mounted" and alive(record.get("pid")):
            found.append(record)
    return found


def _read_run_file(path: Path) -> RunRecord | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return cast(RunRecord, data) if isinstance(data, dict) else None


def live_mounts(store: Path) -> dict[str, str]:
    """volume -> mount point of every single-volume mount a live daemon serves, from the
    run files (the CSI plugin finds what it staged here after a restart)."""
    found: dict[str, str] = {}
    for path in (store / "run").glob("*.json"):
        record = _read_run_file(path)
        if record and record.get("state") == "mounted" and record.get("volume") and alive(record.get("pid")):
            found[str(record["volume"])] = str(record.get("mountpoint"))
    return found


def served_volume(store: Path, mountpoint: str) -> tuple[str | None, bool]:
    """(the volume, whether its daemon lives) of the single-volume mount of this store at
    `mountpoint`, from its run file; (None, False) if the store has no such mount."""
    record = _read_run_file(run_path(store, mountpoint))
    if not record or record.get("state") != "mounted" or record.get("mountpoint") != mountpoint:
        return None, False
    volume = record.get("volume")
    return (str(volume) if volume else None), alive(record.get("pid"))


# -- casfs umount ------------------------------------------------------------------------


def umount_main(args: argparse.Namespace) -> int:
    timeout = float(getattr(args, "timeout", None) or UMOUNT_TIMEOUT_S)
    unmount(os.path.abspath(args.mountpoint), timeout, took=lambda snap: print(f"snapshot {snap}"))
    return 0


def unmount(
    mountpoint: str, timeout: float = UMOUNT_TIMEOUT_S, took: Callable[[str], None] = lambda snap: None
) -> list[str]:
    """`casfs umount`: save, unmount, wait for the daemon; the snapshots its unmount took
    ("volume@n"), each also given to `took` as soon as known (before any error below).
    A failure to save refuses (the mount stays, nothing lost); a failure after the
    unmount raises too, saying what was kept. (The CLI and NodeUnstageVolume.)"""
    entry = find_mount(mountpoint)
    if entry is None or not entry.is_casfs:
        raise NotFound(f"{mountpoint} is not a casfs mount")
    store = Path(entry.source.removeprefix("casfs:"))
    run_file = run_path(store, mountpoint)
    before = _read_run_file(run_file)
    pid = int(before["pid"]) if before and before.get("state") == "mounted" else None
    if before is not None and not before.get("read_only", True):
        _save_before_unmount(mountpoint, log_path(store, mountpoint))
    try:
        done = subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise Busy(f"unmounting {mountpoint} timed out") from None
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"status {done.returncode}"
        raise Busy(f"cannot unmount {mountpoint}: {why}")
    if pid is None:
        return []
    if not wait_pid_gone(pid, timeout):
        raise Busy(f"unmounted {mountpoint}, but its daemon (pid {pid}) is busy after {timeout:.0f} s")
    after = _read_run_file(run_file) or RunRecord()
    snapshots = list(after.get("snapshots", []))
    for snap in snapshots:
        took(snap)
    where = log_path(store, mountpoint)
    if after.get("pid") != pid or after.get("state") != "exited":
        raise CasfsError(f"the daemon of {mountpoint} (pid {pid}) did not finish cleanly; see {where}")
    if not after.get("clean", False):
        lost = ", ".join(after.get("unsaved", [])) or "some volumes"
        raise CasfsError(f"{mountpoint} unmounted, but changes to {lost} could not be saved; see {where}")
    if after.get("unsnapshotted"):
        which = ", ".join(after["unsnapshotted"])
        raise CasfsError(
            f"{mountpoint} unmounted and every change saved, but the snapshot of {which} failed "
            f"(the next mount or `casfs snapshot create` takes it); see {where}"
        )
    return snapshots


def _save_before_unmount(mountpoint: str, log: Path) -> None:
    """Ask the daemon to save everything it buffers; if it cannot, refuse to unmount
    (as umount(8) refuses a busy filesystem): unmounting would throw the data away."""
    try:
        os.setxattr(mountpoint, "user.casfs.flush", b"")
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return  # a daemon from before the flush control: its unmount flushes as it can
        raise CasfsError(
            f"not unmounting {mountpoint}: saving its buffered writes failed: {_named(e.errno)}; "
            f"it stays mounted and nothing is lost ({_remedy(e.errno, log)}, then run casfs umount again)"
        ) from None


def _named(code: int | None) -> str:
    """An errno as its name and message: 'EPERM (Operation not permitted)'."""
    code = code or errno.EIO
    return f"{errno.errorcode.get(code, f'errno {code}')} ({os.strerror(code)})"


def _remedy(code: int | None, log: Path) -> str:
    """What lets a refused flush through: room for a full disk or quota, else whatever
    the daemon's log says refused it (a read-only or immutable store, its permissions)."""
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "free space in the store (casfs gc works while it is mounted)"
    return f"see {log} for what refused the write and set that right"


def wait_pid_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
