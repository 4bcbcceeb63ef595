"""Real mounts in tests: the daemon in a subprocess, always unmounted.

    with mounted(store, mnt) as m:        # python -m casfs.fuse.daemon, ready pipe
        ...                                # m.path, m.pid, m.log()
    # here: fusermount3 -u, the daemon exited 0, or the test failed; never a leftover

The clean unmount and the forced cleanup are two functions (pyfuse3's test/util.py
keeps them apart too). The forced one escalates: fusermount3 -u -> -u -z -> SIGTERM
-> SIGKILL -> abort the FUSE connection through /sys/fs/fuse/connections/<minor>, and
never stats the mount point (a stat on a hung FUSE mount blocks for ever). Every
subprocess call has a timeout; the daemon runs with entry/attr timeouts of 0.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from casfs.fuse import passthrough
from casfs.fuse.mountinfo import MountEntry, mounts
from tests.helpers.cli import CALL_TIMEOUT, passthrough_wanted, run
from tests.helpers.procs import alive

DAEMON = [sys.executable, "-m", "casfs.fuse.daemon"]
READY_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 60.0
FUSECTL = Path("/sys/fs/fuse/connections")


@dataclass
class Mount:
    path: Path
    store: Path
    proc: subprocess.Popen[bytes] | None  # the daemon, when the test started it directly
    pid: int
    log_path: Path

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


# -- /proc -----------------------------------------------------------------------------


def casfs_mounts(under: str = "/") -> list[MountEntry]:
    return [m for m in mounts() if m.is_casfs and m.mountpoint.startswith(under)]


def is_mounted(path: Path | str) -> bool:
    """A casfs mount at `path`, from /proc/self/mountinfo (without touching the path)."""
    return any(m.mountpoint == str(path) and m.is_casfs for m in mounts())


def daemon_pids(under: str) -> list[int]:
    """casfs daemons (any mode) whose command line names a path under `under`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [c.decode(errors="replace") for c in cmd]
        ours = any("casfs.fuse.daemon" in w for w in words) and any(under in w for w in words)
        if ours and alive(int(entry)):
            pids.append(int(entry))
    return pids


def wait_gone(pid: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return True
        if proc is None and not alive(pid):
            return True
        time.sleep(0.05)
    return False


# -- mounting ------------------------------------------------------------------------


def start_daemon(
    store: Path,
    mountpoint: Path,
    *,
    volume: str | None = None,
    ro: bool = False,
    extra: Sequence[str] = (),
    kernel_cache: bool = False,
    passthrough: bool | None = None,
) -> Mount:
    """Start a foreground daemon and wait until the mount answers; fail at once if the
    daemon dies first (its log is in the failure message). Tests see every change at
    once (zero entry and attribute timeouts) unless `kernel_cache`: a user's timeouts.
    Passthrough as CASFS_TEST_PASSTHROUGH says unless `passthrough` or `extra` does;
    the daemon's mode is checked against it (assert_mode)."""
    if passthrough is None:
        passthrough = passthrough_wanted() and "--no-passthrough" not in extra
    if not passthrough and "--no-passthrough" not in extra:
        extra = [*extra, "--no-passthrough"]
    log_path = mountpoint.parent / f".{mountpoint.name}.daemon.log"
    cmd = [*DAEMON, "--store", str(store)] + ([] if kernel_cache else ["--zero-timeouts"])
    cmd += ["--volume", volume] if volume else []
    cmd += ["--ro"] if ro else []
    cmd += list(extra)
    r, w = os.pipe()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [*cmd, "--ready-fd", str(w), str(mountpoint)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(w,),
            start_new_session=True,
        )
    os.close(w)
    m = Mount(mountpoint, store, proc, proc.pid, log_path)
    try:
        word = _read_word(r, proc, READY_TIMEOUT_S)
    finally:
        os.close(r)
    if word.split(" ", 1)[0] != "ready":  # (then a JSON list of warnings, if any)
        force_cleanup(m)
        pytest.fail(f"the daemon did not come up ({word or 'no word'}):\n{m.log()}")
    try:
        assert_mode(m, passthrough)
    except BaseException:
        force_cleanup(m)
        raise
    return m


def assert_mode(m: Mount, wanted: bool) -> None:
    """The daemon runs in the passthrough mode asked for: "on" where this host can have
    it (root, a pyfuse3 built with it; the kernel then must grant it), else off."""
    mode = os.getxattr(m.path, "user.casfs.passthrough").decode()
    if not wanted:
        assert mode == "off: turned off (--no-passthrough)", f"{mode}\n{m.log()}"
    elif passthrough.built_in() and os.geteuid() == 0:
        assert mode == "on", f"{mode}\n{m.log()}"
    else:
        assert mode.startswith("off: ") and "turned off" not in mode, mode


def _read_word(fd: int, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            part = os.read(fd, 1024)
            if not part:
                break  # the daemon closed the pipe: it exited or reported
            data += part
        elif proc.poll() is not None:
            break
    return data.decode(errors="replace").strip()


def unmount(m: Mount) -> None:
    """The clean path: fusermount3 -u, then the daemon must exit 0."""
    done = run(["fusermount3", "-u", m.path], timeout=CALL_TIMEOUT)
    assert done.returncode == 0, f"fusermount3 -u {m.path}: {done.stderr}"
    assert wait_gone(m.pid, m.proc, EXIT_TIMEOUT_S), f"the daemon did not exit after unmount:\n{m.log()}"
    if m.proc is not None:
        assert m.proc.returncode == 0, f"the daemon exited {m.proc.returncode}:\n{m.log()}"
    assert not is_mounted(m.path)


def force_cleanup(m: Mount) -> None:
    """Whatever state it is in: no mount and no daemon afterwards."""
    cleanup(m.path, m.pid, m.proc)


def cleanup(path: Path | str, pid: int | None, proc: subprocess.Popen[bytes] | None = None) -> None:
    steps: list[list[str]] = [["fusermount3", "-u", str(path)], ["fusermount3", "-u", "-z", str(path)]]
    for cmd in steps:
        if not is_mounted(path):
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            run(cmd, timeout=10)
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if pid is None or wait_gone(pid, proc, 0.5):
            break
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        wait_gone(pid, proc, wait)
    for info in [i for i in mounts() if i.mountpoint == str(path) and i.is_casfs]:
        abort_connection(info.minor)
        with contextlib.suppress(subprocess.TimeoutExpired):
            run(["fusermount3", "-u", "-z", str(path)], timeout=10)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def abort_connection(minor: int) -> None:
    """Cut a FUSE connection: every request then fails with ENOTCONN."""
    if not FUSECTL.joinpath(str(minor)).exists():
        with contextlib.suppress(subprocess.TimeoutExpired):
            run(["mount", "-t", "fusectl", "fusectl", str(FUSECTL)], timeout=10)
    with contextlib.suppress(OSError):
        FUSECTL.joinpath(str(minor), "abort").write_text("1")


@contextlib.contextmanager
def public_dir() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path is root's alone), for mount
    points that tests visit as another user."""
    path = Path(tempfile.mkdtemp(prefix="casfs-test-", dir="/tmp"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        if not any(m.mountpoint.startswith(str(path)) for m in mounts()):
            shutil.rmtree(path, ignore_errors=True)


def as_nobody(*cmd: str | Path) -> subprocess.CompletedProcess[str]:
    return run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd])


@contextlib.contextmanager
def running(
    store: Path,
    mountpoint: Path,
    *,
    volume: str | None = None,
    extra: Sequence[str] = (),
    passthrough: bool | None = None,
) -> Iterator[Mount]:
    """A daemon for a test that ends it some other way (kill -9, a refused or forced
    unmount): afterwards no mount and no daemon are left, whatever happened."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    m = start_daemon(store, mountpoint, volume=volume, extra=extra, passthrough=passthrough)
    try:
        yield m
    finally:
        cleanup(m.path, m.pid, m.proc)


@contextlib.contextmanager
def mounted(
    store: Path,
    mountpoint: Path,
    *,
    volume: str | None = None,
    ro: bool = False,
    extra: Sequence[str] = (),
    kernel_cache: bool = False,
    passthrough: bool | None = None,
) -> Iterator[Mount]:
    """Mount, yield, and always unmount: cleanly when possible, by force otherwise."""
    if not mountpoint.exists():  # a directory by default; block volumes need a file made first
        mountpoint.mkdir(parents=True)
    m = start_daemon(
        store,
        mountpoint,
        volume=volume,
        ro=ro,
        extra=extra,
        kernel_cache=kernel_cache,
        passthrough=passthrough,
    )
    try:
        yield m
    finally:
        try:
            unmount(m)
        finally:
            if is_mounted(m.path) or alive(m.pid):
                force_cleanup(m)


@contextlib.contextmanager
def kernel_mounted(where: Path, *args: str | Path, settle_s: float = 10.0) -> Iterator[Path]:
    """`mount ARGS WHERE` (a loop device's filesystem, a tmpfs) for the body, always
    unmounted after it: umount is retried for `settle_s` (a file the body held may close
    late, as an object's closed from a thread once collected), then done lazily, and a
    body that passed fails (one that raised keeps its own error)."""
    where.mkdir(exist_ok=True)
    done = run(["mount", *args, where])
    assert done.returncode == 0, f"mount {where}: {done.stderr}"
    passed = False
    try:
        yield where
        passed = True
    finally:
        deadline = time.monotonic() + settle_s
        while (done := run(["umount", where])).returncode != 0:
            if time.monotonic() > deadline:
                run(["umount", "-l", where])
                if passed:
                    pytest.fail(f"umount {where}: {done.stderr}")
                break
            time.sleep(0.05)


def fsync(path: Path) -> None:
    """fsync(2) of a file by path (opened read-only: fsync needs no write access)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
