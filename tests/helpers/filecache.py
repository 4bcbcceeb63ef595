"""Passthrough's whole-file cache seen through a mount: its status line, and waiting for
its background fills."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.helpers.mount import Mount

FILL_WAIT_S = 60.0  # a bound on a wait, not a speed asserted


def file_cache(mnt: Path) -> str:
    return os.getxattr(mnt, "user.casfs.file_cache").decode()


def wait_filled(m: Mount, n: int) -> str:
    """The cache's status once `n` background fills have finished in this mount."""
    deadline = time.monotonic() + FILL_WAIT_S
    while not (status := file_cache(m.path)).split("background fills: ")[1].startswith(f"{n} filled"):
        assert time.monotonic() < deadline, f"{status}\n{m.log()}"
        time.sleep(0.05)
    return status
