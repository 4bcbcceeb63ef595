"""Shared fixtures.

`store` is a fresh store's path (`repo` opens it). Every store a test made, through
`store` or registered with `stores.add`, is checked with fsck when the test ends: a
test fails if it leaves a store inconsistent, unless it is marked
`@pytest.mark.no_fsck("why")` because damage is what it is about.

Every test is also checked for leftovers: a casfs mount or a casfs daemon started under
this session's temporary directory that outlives its test fails it (and is cleaned up,
so the next test starts clean). A test that hangs dumps every thread's stack after
TEST_TIMEOUT_S (faulthandler), so a stuck mount shows where it is stuck."""

from __future__ import annotations

import contextlib
import faulthandler
import sqlite3
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from casfs.repo import Repository
from tests.helpers import mount
from tests.helpers.fsck import Stores, fsck_clean
from tests.helpers.seaweed import s3_prefix, seaweed  # noqa: F401  (fixtures: a real S3 server)

TEST_TIMEOUT_S = 300.0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item: the fsck below is pointless after a failure.
    A failure from SQLite gets its extended code added: its message alone ("disk I/O
    error") does not say which of SQLite's cases it was (a flake seen once under load)."""
    report = yield
    item.stash.setdefault(_reports, {})[report.when] = report
    code = _sqlite_code(call.excinfo.value if call.excinfo is not None else None)
    if code is not None:
        report.sections.append(("SQLite", code))
    return report


def _sqlite_code(e: BaseException | None) -> str | None:
    """The extended code of the first sqlite3 error in `e`'s chain of causes."""
    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, sqlite3.Error):
            return f"{type(e).__name__}: {e} ({getattr(e, 'sqlite_errorname', 'no code')})"
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


_reports = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.fixture(autouse=True)
def stores(request: pytest.FixtureRequest) -> Iterator[Stores]:
    """The stores the test made; fsck'd when it ends (after no_leftover_mounts has
    ended, which asks for this fixture for that: no daemon holds a store then)."""
    made = Stores()
    yield made
    marker = request.node.get_closest_marker("no_fsck")
    if marker is not None:
        assert marker.args, "no_fsck needs a reason"
        return
    call = request.node.stash.get(_reports, {}).get("call")
    if call is None or call.failed:
        return
    for path in made.paths:
        if (path / "catalog.db").exists():
            fsck_clean(path, timeout=0)  # Busy if the test leaked the store's lock


@pytest.fixture(autouse=True)
def no_leftover_mounts(tmp_path_factory: pytest.TempPathFactory, stores: Stores) -> Iterator[None]:
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
def store(tmp_path: Path, stores: Stores) -> Path:
    """A new, empty store (checked with fsck when the test ends)."""
    path = stores.add(tmp_path / "store")
    Repository.init(path).close()
    return path


@pytest.fixture
def repo(store: Path) -> Iterator[Repository]:
    """The store, open."""
    with contextlib.closing(Repository.open(store)) as r:
        yield r
