"""Snapshots taken while mounted, for tests: holding their folds, seeing them, waiting."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from casfs.lifecycle.queue import acquire_slot, queue_limit
from casfs.repo import Repository
from tests.helpers.cli import js

WAIT_S = 60.0


@contextlib.contextmanager
def folds_held(store: Path) -> Iterator[None]:
    """Every job slot of the store taken (released on the way out, whatever happens)."""
    with contextlib.closing(Repository.open(store)) as repo:
        slots = [acquire_slot(repo, "a test holding folds") for _ in range(queue_limit(repo))]
    try:
        yield
    finally:
        for slot in slots:
            slot.release()


def snapshots(store: Path, volume: str) -> dict[int, bool]:
    """n -> folded, as `snapshot ls` shows them."""
    return {s["n"]: s["folded"] for s in js(store, "snapshot", "ls", volume)}


def wait_until(what: str, done: Callable[[], Any], within: float = WAIT_S) -> Any:
    """Poll `done` until it returns something true (a loaded machine: up to `within`
    seconds); that value."""
    deadline = time.monotonic() + within
    while not (value := done()):
        assert time.monotonic() < deadline, f"still waiting for {what} (after {within:.0f} s)"
        time.sleep(0.05)
    return value
