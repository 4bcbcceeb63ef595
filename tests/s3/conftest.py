"""Fixtures of the S3 tests: the replica tests' sshd (the two-host test of a shared
bucket), and the session's SeaweedFS settings in this process's environment."""

import pytest

from tests.helpers.seaweed import Seaweed
from tests.replica.conftest import sshd  # noqa: F401  (a fixture)


@pytest.fixture
def s3_env(seaweed: Seaweed, monkeypatch: pytest.MonkeyPatch) -> Seaweed:
    """The server, its AWS_* settings exported (casfs reads them, as the AWS tools do)."""
    for k, v in seaweed.env().items():
        monkeypatch.setenv(k, v)
    return seaweed
