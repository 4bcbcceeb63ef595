"""The daemon's wait for the next FUSE request (casfs.fuse.fastwait), on a pipe standing in
for /dev/fuse: True only when a poll has just seen the fd readable (pyfuse3 then reads
it with no await between, and a read of an empty fd would block the daemon), pyfuse3's
own wait only for an idle fd, and pyfuse3's function back in place after a session."""

from __future__ import annotations

import os
import select
from collections.abc import Iterator
from types import SimpleNamespace

import pyfuse3
import pytest
import trio
import trio.testing

from casfs.fuse import fastwait


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def test_a_queued_request_is_taken_without_the_stock_wait(pipe: tuple[int, int]) -> None:
    """With a task in pyfuse3's wait (so pyfuse3 starts no new one), a task done with its
    request takes the next one at once; a lone task goes through pyfuse3's wait."""
    r, w = pipe
    calls: list[str] = []
    lock = trio.Lock()

    async def stock() -> bool:  # pyfuse3's: one task at a time in wait_readable
        calls.append("stock")
        async with lock:
            await trio.lowlevel.wait_readable(r)
        return True

    async def main() -> None:
        wait = fastwait.make_wait(r, stock)
        async with trio.open_nursery() as nursery:
            await lock.acquire()  # (as another task in wait_readable holds it)
            nursery.start_soon(wait)  # queued behind it: pyfuse3 counts it as waiting
            await trio.testing.wait_all_tasks_blocked()
            assert calls == ["stock"]
            os.write(w, b"x")
            assert await wait() is True
            assert calls == ["stock"]
            nursery.cancel_scope.cancel()
            lock.release()

    trio.run(main)
    assert trio.run(fastwait.make_wait(r, stock)) is True
    assert calls == ["stock"] * 2


def test_requests_queued_are_taken_in_bursts_between_checkpoints(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While requests stay queued, a task takes up to _BURST of them in a row with no
    checkpoint (a pass of trio's scheduler each), and other tasks still run between
    bursts. (_BURST_S made long: no clock decides what the test sees.)"""
    r, w = pipe
    monkeypatch.setattr(fastwait, "_BURST_S", 3600.0)
    lock = trio.Lock()
    runs = [0]

    async def stock() -> bool:
        async with lock:
            await trio.lowlevel.wait_readable(r)
        return True

    async def other() -> None:  # another task of the trio thread (a timer, a flush)
        while True:
            await trio.lowlevel.checkpoint()
            runs[0] += 1

    async def main() -> None:
        wait = fastwait.make_wait(r, stock)
        async with trio.open_nursery() as nursery:
            await lock.acquire()  # (another task is in pyfuse3's wait: none is started)
            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(other)
            os.write(w, b"x")  # (never read: the fd stays readable, requests queued)
            taken, before = 3 * (fastwait._BURST + 1), runs[0]
            for _ in range(taken):
                assert await wait() is True
            # One checkpoint per _BURST + 1 requests (3 here, not 27), and the other
            # task runs at each (its count lags by one, by the scheduler's batch order).
            assert 1 <= runs[0] - before <= 3
            nursery.cancel_scope.cancel()
            lock.release()

    trio.run(main)


class _Polls:
    """select.poll's stand-in: the fd reads as idle for the first `idle` polls."""

    def __init__(self, idle: int) -> None:
        self.idle, self.calls = idle, 0

    def __call__(self) -> _Polls:
        return self

    def register(self, fd: int, events: int) -> None:
        pass

    def poll(self, timeout: int) -> list[tuple[int, int]]:
        self.calls += 1
        return [] if self.calls <= self.idle else [(0, select.POLLIN)]


def _waits(polls: _Polls, n: int, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """n waits of a task while another is in pyfuse3's wait: the polls each made (its
    own pyfuse3 wait returns False at once: the session ended)."""
    monkeypatch.setattr(fastwait, "select", SimpleNamespace(poll=polls, POLLIN=select.POLLIN))
    lock = trio.Lock()
    other: list[trio.lowlevel.Task] = []

    async def stock() -> bool:
        if trio.lowlevel.current_task() in other:
            async with lock:
                await trio.sleep_forever()
        return False

    async def main() -> list[int]:
        wait = fastwait.make_wait(0, stock)
        seen = []
        async with trio.open_nursery() as nursery:
            await lock.acquire()

            async def in_stock() -> None:
                other.append(trio.lowlevel.current_task())
                await wait()

            nursery.start_soon(in_stock)
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(n):
                before = polls.calls
                await wait()
                seen.append(polls.calls - before)
            nursery.cancel_scope.cancel()
            lock.release()
        return seen

    return trio.run(main)


def test_a_lone_request_is_polled_for_before_the_task_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """At queue depth 1 the next request comes a few µs after the reply: the task polls
    for it (within _SPIN_S; made long here: no clock decides) rather than sleep in
    pyfuse3's wait, and takes it straight after the poll that saw it."""
    monkeypatch.setattr(fastwait, "_SPIN_S", 3600.0)
    polls = _Polls(idle=5)  # (the one after the checkpoint, then four of the spin)
    monkeypatch.setattr(fastwait, "select", SimpleNamespace(poll=polls, POLLIN=select.POLLIN))
    lock = trio.Lock()
    calls: list[str] = []

    async def stock() -> bool:
        calls.append("stock")
        async with lock:
            await trio.sleep_forever()
        return True

    async def main() -> bool:
        wait = fastwait.make_wait(0, stock)
        async with trio.open_nursery() as nursery:
            await lock.acquire()
            nursery.start_soon(wait)  # (in pyfuse3's wait: no task is started for this one)
            await trio.testing.wait_all_tasks_blocked()
            got = await wait()
            nursery.cancel_scope.cancel()
            lock.release()
            return got

    assert trio.run(main) is True
    assert polls.calls == 6 and calls == ["stock"]  # (the other task's only)


def test_a_spin_that_finds_nothing_backs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spin that times out sends the next lone request to sleep at once, then the next
    two, four...: a process that thinks between its requests is not polled for."""
    monkeypatch.setattr(fastwait, "_SPIN_S", 0.0)  # (each spin polls once and gives up)
    # 2: the poll after the checkpoint and one of a spin; 1: no spin (backing off)
    assert _waits(_Polls(idle=1 << 30), 11, monkeypatch) == [2, 1, 2, 1, 1, 2, 1, 1, 1, 1, 2]


def test_a_stock_wake_up_is_checked_again(pipe: tuple[int, int]) -> None:
    """pyfuse3's wait can wake a task after another took the request: the wait goes on
    until the fd really is readable, and ends as pyfuse3's does (False)."""
    r, w = pipe
    calls: list[str] = []

    async def stock() -> bool:
        calls.append("stock")
        if len(calls) <= 2:  # woken with nothing there
            await trio.lowlevel.checkpoint()
        else:  # (the request arrives only now: no clock decides what the polls see)
            os.write(w, b"x")
            await trio.lowlevel.wait_readable(r)
        return True

    assert trio.run(fastwait.make_wait(r, stock)) is True
    assert calls == ["stock"] * 3
    assert os.read(r, 1) == b"x"


def test_an_ended_session_ends_the_wait(pipe: tuple[int, int]) -> None:
    r, _ = pipe

    async def stock() -> bool:
        return False

    assert trio.run(fastwait.make_wait(r, stock)) is False


def test_without_a_session_pyfuse3_keeps_its_own_wait() -> None:
    stock = pyfuse3._wait_fuse_readable  # type: ignore[attr-defined]
    with fastwait.installed() as fast:
        assert fast is False
        assert pyfuse3._wait_fuse_readable is stock  # type: ignore[attr-defined]
    assert pyfuse3._wait_fuse_readable is stock  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("version", "fits"),
    [
        ("3.5.0", True),
        ("3.5.0+casfs.1", True),
        ("3.5.0+casfs.12", True),
        ("3.5.0+casfs.2.passthrough", True),
        ("3.5.0+casfs.2.other", False),
        ("3.5.0+other", False),
        ("3.5.1", False),
    ],
)
def test_the_wait_is_put_in_place_only_for_the_session_loop_it_was_checked_against(
    version: str, fits: bool
) -> None:
    """casfs's patched build (a local label on 3.5.0) has 3.5.0's session loop."""
    assert fastwait.checked(version) is fits
