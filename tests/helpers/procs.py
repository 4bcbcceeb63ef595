"""Processes a test started, by pid: their state in /proc (R, S, T stopped, Z zombie…)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def state(pid: int) -> str | None:
    """Its state letter, or None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """It exists and is neither a zombie nor dead."""
    return state(pid) not in (None, "Z", "X")


def stopped(pid: int) -> bool:
    return state(pid) == "T"


def wait_stopped(pid: int, running: Callable[[], bool], timeout: float = 30.0) -> None:
    """Until `pid` has stopped itself (CASFS_STOP at a fault point); fails if `running()`
    turns false first (it ended) or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not stopped(pid):
        assert running(), f"process {pid} ended before it stopped"
        assert time.monotonic() < deadline, f"process {pid} did not stop in {timeout:.0f} s"
        time.sleep(0.02)
