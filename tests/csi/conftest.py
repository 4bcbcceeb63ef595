"""The plugin fixture: `casfs csi serve` on a fresh store, a kubelet directory beside it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.csi import Plugin, leftovers_under, plugin_running


@pytest.fixture
def kubelet(tmp_path: Path) -> Path:
    """Where the tests' staging and target paths are (kubelet's pods/ and plugins/)."""
    return tmp_path / "kubelet"


@pytest.fixture
def plugin(store: Path, kubelet: Path) -> Iterator[Plugin]:
    with plugin_running(store, kubelet) as p:
        yield p
        status = p.stop()
        assert status == 0, f"the plugin exited {status} at SIGTERM:\n{p.log()}"
    assert leftovers_under(kubelet) == []
