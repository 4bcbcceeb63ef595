"""Shared fixtures. Every test is checked for leftovers: a casfs mount or a casfs daemon
started under this session's temporary directory that outlives its test fails it (and
is cleaned up, so the next test starts clean). A test that hangs dumps every thread's
stack after TEST_TIMEOUT_S (faulthandler), so a stuck mount shows where it is stuck."""

from __future__ import annotations

import faulthandler
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.repo import Repository
from tests.helpers import mount

TEST_TIMEOUT_S = 300.0


@pytest.fixture(autouse=True)
def no_leftover_mounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    base = str(tmp_path_factory.getbasetemp())
    mounts_before = {m.mountpoint for m in mount.casfs_mounts(base)}
    daemons_before = set(mount.daemon_pids(base))
    faulthandler.dump_traceback_later(TEST_TIMEOUT_S, exit=False)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
    mounts = [m for m in mount.casfs_mounts(base) if m.mountpoint not in mounts_before]
    daemons = [p for p in mount.daemon_pids(base) if p not in daemons_before]
    for m in mounts:
        mount.cleanup(m.mountpoint, None)
    for pid in daemons:
        mount.cleanup("", pid)
    if mounts or daemons:
        pytest.fail(
            f"left behind: mounts {[m.mountpoint for m in mounts]}, daemon pids {daemons}", pytrace=False
        )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Repository]:
    repo = Repository.init(tmp_path / "store")
    yield repo
    repo.close()
