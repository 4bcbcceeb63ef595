"""Whether the process that recorded a phase (its owner_pid) still runs.

A zombie has finished its work: it counts as dead. Pids are those of this PID
namespace: every process using one store must share it (or a live owner in another
namespace would look dead, and its phase would be recovered from under it).
"""

from __future__ import annotations

import os


def alive(pid: int | None) -> bool:
    if not pid or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        return _signal_alive(pid)
    return state not in (b"Z", b"X")


def _signal_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
