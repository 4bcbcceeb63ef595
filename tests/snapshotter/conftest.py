"""Fixtures: the test image (built once), and containerd with the casfs snapshotter
(one stack per module: containerd starts in about a second)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.fsck import fsck_clean
from tests.snapshotter.build import archive, build_busybox
from tests.snapshotter.stack import Stack, running


@dataclass
class Image:
    layout: Path  # OCI layout, tag v1
    tar: Path  # the same, as `ctr images import` reads it


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    work = tmp_path_factory.mktemp("snapshotter-image")
    layout = build_busybox(work)
    return Image(layout, archive(layout, work / "busybox.tar"))


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running() as s:
        yield s
        s.stop_all()
        fsck_clean(s.store)
