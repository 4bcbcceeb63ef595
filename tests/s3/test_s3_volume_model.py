"""The volume model (tests/model/test_volume_model.py) over a store whose blobs live in
a real bucket (SeaweedFS): random namespace and data operations, flushes, snapshots,
faults injected into the S3 store's staging and publishing, and crash-restarts, each
checked against a plain directory; at the end gc and fsck over the bucket."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.helpers.seaweed import BUCKET, Seaweed, fresh_prefix
from tests.model.test_volume_model import VolumeModel


def test_a_volume_over_s3_agrees_with_its_model(seaweed: Seaweed, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in seaweed.env().items():
        monkeypatch.setenv(k, v)

    class OverS3(VolumeModel):
        @staticmethod
        def blob_url() -> str:
            return f"s3://{BUCKET}/{fresh_prefix()}"

        def __init__(self) -> None:
            super().__init__()
            assert (self.repo.path / "blobs.json").exists()  # (its blobs in the bucket)

    run_state_machine_as_test(
        OverS3,
        settings=settings(
            max_examples=8,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
