"""The fault-injecting blob store (casfs.store.faulty) fails what its plan says, and
what fails above it loses nothing: a batch whose publish stopped half-way leaves only
orphans, and the next batch of the same blobs completes them."""

from __future__ import annotations

import errno

import pytest

from casfs.errors import Corruption
from casfs.refcount.fsck import fsck
from casfs.repo import Repository
from casfs.store.faulty import Faults, FaultyBlobStore


def install(repo: Repository, plan: str) -> Faults:
    faults = Faults.parse(plan)
    repo.blobs = FaultyBlobStore(repo.blobs, faults)
    return faults


def store(repo: Repository, *chunks: bytes) -> None:
    """Blobs in, unreferenced (garbage rows: fsck counts them right, gc would free them)."""
    with repo.batch() as b:
        for c in chunks:
            b.put(c)
        b.commit()


def test_the_nth_call_fails_with_the_errno_planned(repo: Repository) -> None:
    faults = install(repo, "stage:2:ENOSPC")
    store(repo, b"one")
    with pytest.raises(OSError) as e:
        store(repo, b"two")
    assert e.value.errno == errno.ENOSPC and faults.fired == 1
    store(repo, b"two")  # the third call goes through
    assert fsck(repo, timeout=0).clean


def test_a_publish_that_stops_half_way_is_completed_by_the_next_batch(repo: Repository) -> None:
    install(repo, "publish-half:1:EIO")
    chunks = [bytes([i]) * 1000 for i in range(1, 9)]
    with pytest.raises(OSError):
        store(repo, *chunks)
    assert repo.conn.execute("SELECT count(*) FROM blobs").fetchone()[0] == 0
    report = fsck(repo, timeout=0)
    assert {p.kind for p in report.problems} == {"orphan"}  # published files, no rows
    store(repo, *chunks)
    assert fsck(repo, timeout=0).clean
    assert repo.conn.execute("SELECT count(*) FROM blobs").fetchone()[0] == 8


def test_an_injected_corruption_is_a_corruption_and_marks_the_blob(repo: Repository) -> None:
    faults = install(repo, "")
    store(repo, b"data" * 100)
    (bid,) = [bytes(r[0]) for r in repo.conn.execute("SELECT id FROM blobs")]
    faults.arm("get", -1)
    with pytest.raises(Corruption):
        repo.get(bid)  # type: ignore[arg-type]
    assert bid in repo.blobs.damaged()


def test_a_plan_names_known_operations_and_errnos() -> None:
    with pytest.raises(ValueError, match="unknown operation"):
        Faults.parse("write:1:EIO")
    with pytest.raises(ValueError, match="unknown errno"):
        Faults.parse("stage:1:EWHATEVER")
