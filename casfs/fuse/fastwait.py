"""A cheaper wait for the next FUSE request than pyfuse3 3.5.0's, put in place by installed().

pyfuse3's session loop awaits `_wait_fuse_readable()` before each request: a trio.Lock
and `trio.lowlevel.wait_readable(fd)`, i.e. two trips through the scheduler and an epoll
registration per request even when the kernel has requests queued (as it has under any
queue depth). The loop looks the function up as a module global on each call, so this
one can stand in: one checkpoint (other tasks, timers and signals still run between
requests), then a zero-timeout poll of the fd; only an idle fd goes through pyfuse3's
own wait. While requests stay queued (a queue depth over one), a task takes up to
_BURST of them in a row before the next checkpoint, within _BURST_S: a checkpoint is a
pass of trio's scheduler (about 3 us of CPU), and on the one trio thread that serves
every request that was a fifth of a 4 KiB read served from the chunk cache. After a
lone request (none queued), the fd is polled for up to _SPIN_S before the task sleeps
in pyfuse3's wait, with a backoff when that finds nothing (see _SPIN_S).

What keeps it safe: pyfuse3 reads the fd straight after True with no await between, and
a read of an empty fd would block the thread (the fd is blocking), so True is returned
only right after a poll saw the fd ready, with no await since; pyfuse3's wait may wake a
task after another one has taken the request, so its True is checked again by a poll.
Unmount makes the fd poll as an error, which counts as ready: the read then ends the
session as it does under pyfuse3's wait. pyfuse3 starts a task whenever a request is
taken while no task is in its wait (its count of idle readers): a request is taken here
only while one is, or after a task woken there has let the others run (a task done with
its request then queues in the wait), else its tasks grew to max_tasks, each keeping a
buffer as large as the biggest request it took (a block volume's peak RSS after 1 MiB
writes went from 40 MiB to 139). The session's fd is not exported by pyfuse3; it is the
process's one open /dev/fuse (none or several: nothing is installed). Any other pyfuse3
version keeps its own wait (its loop may differ); casfs's patched build of 3.5.0
(scripts/build-pyfuse3.sh) counts as 3.5.0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import time
from collections.abc import Awaitable, Callable, Iterator
from importlib import metadata

import pyfuse3
import trio

log = logging.getLogger("casfs.daemon")

VERSION = "3.5.0"  # the pyfuse3 whose _session_loop this was checked against
_ATTR = "_wait_fuse_readable"
# Checkpoints a task woken in pyfuse3's wait lets pass for another task to queue there
# before it takes a request anyway (one left 55-59 MiB of the 139; three, none).
_DEFER = 3
# Requests a task may take in a row with no checkpoint between, and for how long, while
# the kernel has more queued: a checkpoint is a pass of trio's scheduler (its epoll_wait,
# its run queue), about 3 us of CPU, a tenth of a 4 KiB read served from the chunk cache.
# Other tasks (timers, signals, tasks woken by worker threads) then wait at most this.
_BURST = 8
_BURST_S = 0.001
# After a lone request (none queued behind it), a task polls for the next one for up to
# _SPIN_S before it sleeps in pyfuse3's wait: a reader or writer at queue depth 1 sends
# it a few µs after its reply, and a sleep in epoll_wait, the wake-up and the pass of
# trio's scheduler that follow cost more than that. A spin that finds nothing makes the
# next 1, 2, 4 ... _SPIN_SKIP_MAX lone requests sleep at once (a process that thinks
# between its requests is not polled for); one that finds a request starts over.
_SPIN_S = 50e-6
_SPIN_SKIP_MAX = 256
_STOCK: Callable[[], Awaitable[bool]] | None = getattr(pyfuse3, _ATTR, None)


def fuse_fd() -> int | None:
    """The fd of this process's FUSE session: its one open /dev/fuse, or None."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                found.append(int(name))
        except OSError:
            continue  # (the listing's own fd, closed by now)
    return found[0] if len(found) == 1 else None


def make_wait(fd: int, stock: Callable[[], Awaitable[bool]]) -> Callable[[], Awaitable[bool]]:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poll = poller.poll
    checkpoint = trio.lowlevel.checkpoint
    clock = time.monotonic
    in_stock = 0  # tasks in pyfuse3's wait: those it counts as idle
    queued = False  # the last request was found queued (more may be: poll at once)
    burst = 0  # requests taken since the last checkpoint
    since = 0.0  # (clock) of the last checkpoint
    backoff = 0  # lone requests to sleep for after the last spin that found nothing
    skip = 0  # of those, still to come

    def spin() -> bool:
        """Poll for _SPIN_S (unless backing off); True when the fd became readable."""
        nonlocal backoff, skip
        if skip:
            skip -= 1
            return False
        end = clock() + _SPIN_S
        while not poll(0):
            if clock() >= end:
                backoff = skip = min(2 * backoff or 1, _SPIN_SKIP_MAX)
                return False
        backoff = 0
        return True

    async def wait_fuse_readable() -> bool:
        nonlocal in_stock, queued, burst, since
        if queued and in_stock and burst < _BURST and clock() - since < _BURST_S and poll(0):
            burst += 1
            return True
        await checkpoint()  # (others run between requests, however many are queued)
        burst, since = 0, clock()
        queued = bool(in_stock and poll(0))
        if queued or (in_stock and spin()):  # (spin: True straight after its poll)
            return True
        deferred = 0
        while True:
            in_stock += 1
            try:
                if not await stock():
                    return False
            finally:
                in_stock -= 1
            while not in_stock and deferred < _DEFER:
                deferred += 1  # (taking the request now would start a task: see above)
                await checkpoint()
            if poll(0):
                return True

    return wait_fuse_readable


def checked(version: str) -> bool:
    """Whether pyfuse3 `version` has the session loop this wait was checked against:
    VERSION itself, or casfs's build of it (scripts/build-pyfuse3.sh: "VERSION+casfs.N",
    whose patch changes only the read reply). Any other local build may differ."""
    return re.fullmatch(re.escape(VERSION) + r"(\+casfs\.\d+(\.passthrough)?)?", version) is not None


@contextlib.contextmanager
def installed() -> Iterator[bool]:
    """The cheaper wait in place for the session pyfuse3.init() opened, while inside;
    yields False (pyfuse3's own wait) where the version or the fd is not the expected."""
    version = metadata.version("pyfuse3")
    fd = fuse_fd()
    if not checked(version) or _STOCK is None or fd is None:
        log.info("pyfuse3 %s: its own wait for requests (fuse fd %s)", version, fd)
        yield False
        return
    setattr(pyfuse3, _ATTR, make_wait(fd, _STOCK))
    try:
        yield True
    finally:
        setattr(pyfuse3, _ATTR, _STOCK)
