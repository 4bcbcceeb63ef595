"""vfs.loading.Load: the chunk cache's light future keeps concurrent.futures.Future's
promises for the methods it has."""

from __future__ import annotations

import threading

import pytest

from casfs.errors import Corruption
from casfs.vfs.loading import Load


def test_a_load_wakes_its_waiters_and_runs_its_callbacks_once() -> None:
    load = Load()
    seen: list[object] = []
    load.add_done_callback(lambda f: seen.append(f.result()))
    got: list[bytes] = []
    waiters = [threading.Thread(target=lambda: got.append(load.result(10))) for _ in range(3)]
    for t in waiters:
        t.start()
    assert not load.done()
    with pytest.raises(TimeoutError):
        load.result(0.01)
    load.set_result(b"chunk")
    for t in waiters:
        t.join(10)
    assert load.done() and got == [b"chunk"] * 3 and seen == [b"chunk"]
    load.add_done_callback(lambda f: seen.append("late"))  # (done: called at once)
    assert seen == [b"chunk", "late"]


def test_a_failed_load_raises_its_error_to_every_reader() -> None:
    load = Load()
    load.set_exception(Corruption("blob x is corrupt"))
    for _ in range(2):
        with pytest.raises(Corruption, match="blob x"):
            load.result()
    with pytest.raises(AssertionError):
        load.set_result(b"late")


def test_a_failing_callback_is_logged_and_the_others_run(caplog: pytest.LogCaptureFixture) -> None:
    load = Load()
    seen: list[bytes] = []

    def bad(_: Load) -> None:
        raise RuntimeError("callback bug")

    load.add_done_callback(bad)
    load.add_done_callback(lambda f: seen.append(f.result()))
    load.set_result(b"chunk")
    assert seen == [b"chunk"] and load.result() == b"chunk"
    assert "callback failed" in caplog.text
