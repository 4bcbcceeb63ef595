"""The replica tests' sshd, for the two-host test of a shared bucket."""

from tests.replica.conftest import sshd  # noqa: F401  (a fixture)
