"""The test images, built once per session (tests/oci/build.py says what they hold)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.oci import build


@dataclass(frozen=True)
class Sample:
    layout: Path
    archive: Path  # docker-archive of v1, tagged sample:v1
    unpacked: Path  # umoci unpack of v1: its rootfs


@pytest.fixture(scope="session")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Sample:
    if not all(shutil.which(t) for t in ("umoci", "skopeo")):
        pytest.skip("umoci and skopeo are needed (scripts/install.sh installs them)")
    work = tmp_path_factory.mktemp("oci-sample")
    layout = build.build_sample(work)
    for how in ("zstd", "plain"):
        build.recompressed(layout, "v1", how, f"v1-{how}")
    build.multi_platform(layout, "v1", "multi")
    archive = build.docker_archive(layout, "v1", work / "sample.tar")
    unpacked = build.umoci_unpack(layout, "v1", work / "unpacked")
    return Sample(layout, archive, unpacked)


@dataclass(frozen=True)
class Debian:
    layout: Path
    unpacked: Path


@pytest.fixture(scope="session")
def debian(tmp_path_factory: pytest.TempPathFactory) -> Debian:
    if not all(shutil.which(t) for t in ("umoci", "skopeo")):
        pytest.skip("umoci and skopeo are needed (scripts/install.sh installs them)")
    work = tmp_path_factory.mktemp("oci-debian")
    layout = build.build_debian(work)
    return Debian(layout, build.umoci_unpack(layout, "debian", work / "unpacked"))
