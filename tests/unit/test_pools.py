"""casfs.store.pools: a shared pool works in the process that made it and, made again,
in a child forked after it had threads (where the inherited one would wait for ever)."""

from __future__ import annotations

import os

from casfs.store.pools import SharedPool


def test_a_pool_is_made_once_and_again_in_a_forked_child() -> None:
    pool = SharedPool(2, "casfs-test")
    first = pool.get()
    assert pool.get() is first
    assert first.submit(sum, [1, 2, 3]).result(timeout=10) == 6
    pid = os.fork()
    if pid == 0:  # the child: a new pool, and it runs work (never back into pytest)
        ok = False
        try:
            fresh = pool.get()
            ok = fresh is not first and fresh.submit(sum, [4, 5]).result(timeout=10) == 9
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pool.get() is first  # (the parent's stays)
