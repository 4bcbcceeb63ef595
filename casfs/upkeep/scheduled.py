"""The scheduled scrub: `casfs config set scrub.every 7d` makes whatever long-running
casfs process a store has (a mount daemon) scrub it that often, at `scrub.rate`, at most
one at a time per store (an flock on STORE/scrub/lock: a second daemon finds it held
and waits for the next turn). When the last one ended is kept in STORE/scrub/last.json,
so that daemons started and stopped meanwhile do not scrub again before it is due. A
scrub cut short (the daemon unmounts) resumes at the next turn (upkeep.scrub's state).

Everything here blocks: a worker thread's, with a store connection of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from casfs import catalog
from casfs.lifecycle.config import effective
from casfs.lifecycle.queue import job_slot
from casfs.repo import Repository
from casfs.store import BlobStore
from casfs.units import parse_duration, parse_size
from casfs.upkeep import scrub


def last_path(store: Path) -> Path:
    return store / "scrub" / "last.json"


def seconds_until(store: Path) -> float | None:
    """Seconds until the next scheduled scrub is due (0 or less: now); None: off. (Reads
    the catalog alone: a store on S3 is not reached.)"""
    with contextlib.closing(catalog.connect(str(store / "catalog.db"))) as conn:
        every = effective(conn, "scrub.every").value
    if every == "off":
        return None
    try:
        last = float(json.loads(last_path(store).read_text())["ended"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0  # never, or a torn record: now
    return last + parse_duration(every) - time.time()


def run(store: Path, stop: threading.Event, blobs: BlobStore | None = None) -> dict[str, Any] | None:
    """Scrub the store if no other process is scrubbing it on schedule; what it found
    (also in last.json), or None: another had the turn, or it was stopped. `blobs`: the
    calling daemon's blob store, lent (a store on S3 is not connected to again)."""
    (store / "scrub").mkdir(exist_ok=True)
    fd = os.open(store / "scrub" / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        due = seconds_until(store)  # (again, under the lock: another may just have done it)
        if due is None or due > 0:
            return None
        repo = Repository.open(store, blobs)
        try:
            report = _scrub(repo, stop)
        finally:
            repo.close(keep_blobs=blobs is not None)
        if report is None:
            return None
        summary = {
            "ended": time.time(),
            "roots": report.roots,
            "blobs": report.blobs,
            "bytes": report.bytes,
            "damaged": [d.blob for d in report.damaged],
            "cache_removed": report.cache_removed,
        }
        tmp = last_path(store).with_suffix(".tmp")
        tmp.write_text(json.dumps(summary))
        os.replace(tmp, last_path(store))
        return summary
    finally:
        os.close(fd)


def _scrub(repo: Repository, stop: threading.Event) -> scrub.ScrubReport | None:
    with job_slot(repo, "scheduled scrub"):
        rate_text = effective(repo.conn, "scrub.rate").value
        rate = None if rate_text == "off" else parse_size(rate_text)
        lock = repo.writer_lock()
        try:
            scrubber = scrub.Scrubber(repo, rate, stop=stop)
            report = scrubber.scrub(scrub.roots(repo), scrub.state_path(repo))
            scrubber.file_cache()
            return report
        except scrub.Stopped:
            return None
        finally:
            lock.release()
