"""A bounded work queue shared by every process on a store: at most `queue.limit`
heavy jobs (imports, snapshot folds, fsck, gc) run at once; the others wait.

    STORE/queue/slot-K         K < limit. A running job holds flock(LOCK_EX) on one, and
                               writes {pid, what, since} into it (emptied on release).
    STORE/queue/wait-PID-ID    one per waiting job, {pid, what, since}; gone once it runs.

No slot is ever stale: the kernel drops a flock with the last descriptor of a process
that dies, however it dies. A dead process's slot or wait file may still name it;
readers check /proc/locks and the pid and ignore (or remove) it. Waiters poll every
POLL_S in no particular order, so a job may overtake an older one.

The limit is read when a job asks for a slot: lowering it lets running jobs finish
(slots at or above the new limit are not taken again). A thread that already holds a
slot runs nested jobs in it: `job_slot` never deadlocks on itself.

Test hook: CASFS_JOB_LOG=PATH appends "start|end PID WHAT" lines, in the order they
happen, each written while the slot is held (see also faults.slow_point).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from casfs.lifecycle import config, pids

if TYPE_CHECKING:
    from casfs.repo import Repository

POLL_S = 0.05
ENV_JOB_LOG = "CASFS_JOB_LOG"

_held = threading.local()


@dataclass(frozen=True)
class Job:
    pid: int
    what: str
    since: float
    slot: int | None  # None: waiting

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class QueueStatus:
    limit: int
    running: list[Job]
    waiting: list[Job]

    def to_json(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "running": [j.to_json() for j in self.running],
            "waiting": [j.to_json() for j in self.waiting],
        }


def queue_dir(repo: Repository) -> Path:
    return repo.path / "queue"


def queue_limit(repo: Repository) -> int:
    return int(config.effective(repo.conn, "queue.limit").value)


class Slot:
    """A held job slot (its flock); release() frees it, from any thread, once."""

    def __init__(self, slot: int, fd: int, what: str) -> None:
        self.slot = slot
        self._fd = fd
        self._what = what

    def release(self) -> None:
        if self._fd >= 0:
            _trace("end", self._what)
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # releases the flock
            self._fd = -1


def acquire_slot(repo: Repository, what: str) -> Slot:
    """Wait for one of the store's job slots (blocks: call it from a worker thread when
    on an event loop). The caller releases it; job_slot() is the usual form."""
    qdir = queue_dir(repo)
    qdir.mkdir(exist_ok=True)
    limit = queue_limit(repo)
    record = {"pid": os.getpid(), "what": what, "since": time.time()}
    taken = _take(qdir, limit, record)
    if taken is None:
        import random  # (only to wait: the CLI does not pay for these at start-up)
        import uuid

        wait_file = _write_json(qdir / f"wait-{os.getpid()}-{uuid.uuid4().hex[:8]}", record)
        try:
            while taken is None:
                time.sleep(random.uniform(POLL_S / 2, POLL_S * 1.5))
                taken = _take(qdir, queue_limit(repo), record)
        finally:
            with contextlib.suppress(FileNotFoundError):
                wait_file.unlink()
    _trace("start", what)
    return Slot(*taken, what)


@contextlib.contextmanager
def job_slot(repo: Repository, what: str) -> Iterator[int]:
    """Run the body in one of the store's job slots, waiting for one to free up; yields
    the slot's number. Safe from any thread (blocks while waiting: not on an event loop).
    Re-entrant within a thread: a job inside a job uses the slot already held."""
    if getattr(_held, "slot", None) is not None:
        yield _held.slot
        return
    slot = acquire_slot(repo, what)
    _held.slot = slot.slot
    try:
        yield slot.slot
    finally:
        _held.slot = None
        slot.release()


def _take(qdir: Path, limit: int, record: dict[str, Any]) -> tuple[int, int] | None:
    for slot in range(limit):
        fd = os.open(qdir / f"slot-{slot}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        data = json.dumps(record).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        return slot, fd
    return None


def _write_json(path: Path, record: dict[str, Any]) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
    return path


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text() or "null")
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _flocked_inodes() -> set[int] | None:
    """Inodes with a flock held for writing (None: /proc/locks unreadable)."""
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    held = set()
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK" or fields[3] != "WRITE":
            continue
        held.add(int(fields[5].rsplit(":", 1)[1]))
    return held


def status(repo: Repository) -> QueueStatus:
    """Who runs and who waits, as far as live processes go (dead entries are dropped)."""
    qdir = queue_dir(repo)
    running: list[Job] = []
    waiting: list[Job] = []
    held = _flocked_inodes()
    entries = sorted(qdir.iterdir()) if qdir.is_dir() else []
    for path in entries:
        name = path.name
        if name.startswith("slot-") and name[5:].isdigit():
            doc = _read_json(path)
            if not doc or not pids.alive(doc.get("pid")):
                continue
            with contextlib.suppress(FileNotFoundError):
                if held is not None and path.stat().st_ino not in held:
                    continue
            running.append(Job(int(doc["pid"]), str(doc["what"]), float(doc["since"]), int(name[5:])))
        elif name.startswith("wait-") and not name.endswith(".tmp"):
            doc = _read_json(path)
            if doc is None:
                continue
            if not pids.alive(doc.get("pid")):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # its process died waiting
                continue
            waiting.append(Job(int(doc["pid"]), str(doc["what"]), float(doc["since"]), None))
    running.sort(key=lambda j: j.slot or 0)
    waiting.sort(key=lambda j: (j.since, j.pid))
    return QueueStatus(queue_limit(repo), running, waiting)


def _trace(event: str, what: str) -> None:
    path = os.environ.get(ENV_JOB_LOG)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{event} {os.getpid()} {what}\n".encode())
        finally:
            os.close(fd)
