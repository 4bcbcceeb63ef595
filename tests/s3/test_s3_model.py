"""The S3 store under random operations, against a model (a dict of what is published).

Hypothesis stages and publishes batches (some publishes fail on purpose, before or
half-way, through casfs.store.faulty), deletes blobs, compacts, and "crashes": the
store object is dropped with a staging unpublished, and a new one is opened from the
bucket alone (a restart, or another host: an empty local directory) and recovers the
dead staging. After every step the store must agree with the model: every blob
published and not deleted reads back, nothing else is listed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from casfs.store.faulty import Faults, FaultyBlobStore
from casfs.store.ids import BlobId, blob_id
from casfs.store.s3.location import Location
from casfs.store.s3.store import S3BlobStore, connect
from tests.helpers.seaweed import BUCKET, Seaweed, fresh_prefix

# A small alphabet of contents, so that batches overlap (a blob published twice, in
# two packs; deleted once: both copies go).
CONTENTS = [bytes([i]) * 3000 if i % 2 else os.urandom(2000) for i in range(12)]
BLOBS = st.lists(st.sampled_from(range(len(CONTENTS))), min_size=1, max_size=6)


def _dead(pid: int) -> bool:
    return False


class S3Model(RuleBasedStateMachine):
    base: Path
    loc: Location

    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.store = self._open()
        self.model: set[BlobId] = set()

    def _open(self) -> S3BlobStore:
        self.n += 1
        store = connect(self.base / f"host{self.n}", self.loc)
        store.create()
        return store

    @rule(items=BLOBS, fail=st.sampled_from([None, "publish", "publish-half"]))
    def publish(self, items: list[int], fail: str | None) -> None:
        faults = Faults()
        if fail is not None:
            faults.arm(fail, 5)  # EIO
        staging = FaultyBlobStore(self.store, faults).staging()
        ids = {blob_id(CONTENTS[i]): CONTENTS[i] for i in items}
        try:
            for bid, plain in ids.items():
                staging.add(bid, plain)
            staging.publish()
        except OSError:
            assert fail is not None
            # Published in part, maybe: whatever is listed now is whole (checked below)
            # and an orphan the model adopts as gc would find it.
            self.model |= set(ids) & set(self.store.list())
        else:
            self.model |= set(ids)
        finally:
            staging.discard()

    @rule(which=st.sampled_from(range(len(CONTENTS))))
    def delete(self, which: int) -> None:
        bid = blob_id(CONTENTS[which])
        self.store.delete(bid)
        self.model.discard(bid)

    @rule(below=st.sampled_from([0.3, 0.7, 1.01]))
    def compact(self, below: float) -> None:
        self.store.compact(below)

    @rule(items=BLOBS)
    def crash_and_reopen_elsewhere(self, items: list[int]) -> None:
        staging = self.store.staging()
        for i in items:
            staging.add(blob_id(CONTENTS[i]), CONTENTS[i])
        old = self.store
        self.store = self._open()
        assert old.recover_staging(_dead) == len(set(items))  # the dead host's leftovers
        assert sorted(self.store.list()) == sorted(self.model)

    @invariant()
    def agrees(self) -> None:
        assert sorted(self.store.list()) == sorted(self.model)
        for i, plain in enumerate(CONTENTS):
            bid = blob_id(plain)
            assert self.store.has(bid) == (bid in self.model), i
            if bid in self.model:
                assert self.store.get(bid) == plain


def test_the_s3_store_agrees_with_its_model(
    seaweed: Seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in seaweed.env().items():
        monkeypatch.setenv(k, v)
    count = 0

    class Case(S3Model):
        def __init__(self) -> None:
            nonlocal count
            count += 1
            self.base = tmp_path / f"case{count}"
            self.loc = Location(BUCKET, fresh_prefix())
            super().__init__()

    run_state_machine_as_test(
        Case,
        settings=settings(
            max_examples=12,
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
