"""Passthrough of large files and block images: filled into the whole-file cache in the
background while the daemon serves them, switched to the kernel at an open with no
daemon-served handle beside it; the cache's bound; scrub re-hashing the cache. The
limits are lowered by the daemon's environment (MiBs, not GiBs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from casfs import images
from casfs.repo import Repository
from casfs.store.filecache import ENV_LIMIT_MB, ENV_OPEN_FILL_MB
from tests.helpers.cli import needs_passthrough, out
from tests.helpers.filecache import file_cache, wait_filled
from tests.helpers.mount import mounted
from tests.mount.test_mount_block import loop_device
from tests.mount.test_passthrough import cached_files, drop_caches, passthrough_mode

pytestmark = needs_passthrough()

CHUNK = 64 << 10
MIB = 1 << 20


def scribble(path: Path) -> None:
    """Change a cache file's first byte behind the daemon's back."""
    with open(path, "r+b") as f:
        f.write(b"X")
    drop_caches()


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files over 1 MiB are filled in the background; the cache holds 4 MiB."""
    monkeypatch.setenv(ENV_OPEN_FILL_MB, "1")
    monkeypatch.setenv(ENV_LIMIT_MB, "4")


@pytest.mark.usefixtures("small_limits")
def test_a_large_file_is_filled_in_the_background_then_read_by_the_kernel(
    repo: Repository, tmp_path: Path
) -> None:
    data = os.urandom(3 * MIB + 123) + bytes(2 * CHUNK)  # (a hole at the end)
    for image in ("one", "two"):  # two images holding the same file
        src = tmp_path / image
        src.mkdir()
        (src / "large").write_bytes(data)
        images.import_image(repo, image, src, chunk_size=CHUNK)
    with mounted(repo.path, tmp_path / "mnt", ro=True) as m:
        assert passthrough_mode(m.path) == "on", m.log()
        large = m.path / "images/one/large"
        with open(large, "rb") as served:  # the first open queues the fill, served meanwhile
            assert served.read() == data
            status = wait_filled(m, 1)
            assert status.startswith("1 files, 3 MiB of 4 MiB"), status
            (cache,) = cached_files(repo.path)
            assert cache.stat().st_size == len(data)
            scribble(cache)
            # A handle the daemon serves is open: the next open is served too (the
            # kernel refuses a backing file beside it), so it reads the true bytes.
            with open(large, "rb") as beside:
                assert beside.read(4) == data[:4]
        # None served now: the next opens are the kernel's, of the cache file, for both
        # images (one copy).
        assert large.read_bytes()[:1] == b"X"
        assert (m.path / "images/two/large").read_bytes()[:1] == b"X"
        assert cached_files(repo.path) == [cache]
        # scrub re-hashes the cache: the changed file goes; the next open is served by
        # the daemon (right bytes) and fills it again in the background.
        said = out(repo.path, "scrub")
        assert f"cached file {cache.name} removed: it no longer matches" in said
        assert not cache.exists()
        assert large.read_bytes() == data
        wait_filled(m, 2)
        assert large.read_bytes() == data
        assert cached_files(repo.path) == [cache]


@pytest.mark.usefixtures("small_limits")
def test_the_cache_stays_within_its_bound_and_refuses_a_file_larger_than_it(
    repo: Repository, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    files = {f"f{i}": os.urandom(900 << 10) for i in range(8)}  # 7 MiB in all, through 4
    files["huge"] = os.urandom(5 * MIB)
    for name, body in files.items():
        (src / name).write_bytes(body)
    images.import_image(repo, "walk", src, chunk_size=CHUNK)
    with mounted(repo.path, tmp_path / "mnt", ro=True) as m:
        for _ in range(2):
            for name, body in files.items():
                assert (m.path / "images/walk" / name).read_bytes() == body
                used = sum(p.stat().st_blocks * 512 for p in cached_files(repo.path))
                assert used <= 4 * MIB
        status = file_cache(m.path)
        assert "1 larger than the cache" in status, status
        assert len(files["huge"]) not in {p.stat().st_size for p in cached_files(repo.path)}


@pytest.mark.usefixtures("small_limits")
def test_a_block_image_through_a_loop_device_reads_its_bytes_from_the_cache(
    repo: Repository, tmp_path: Path
) -> None:
    disk = os.urandom(2 * MIB) + bytes(MIB) + os.urandom(MIB)
    raw = tmp_path / "disk.raw"
    raw.write_bytes(disk)
    images.import_image(repo, "disk", raw)
    with mounted(repo.path, tmp_path / "mnt", ro=True) as m:
        image = m.path / "images/disk"
        with open(image, "rb") as f:  # queues the fill
            f.read(4096)
        wait_filled(m, 1)
        (cache,) = cached_files(repo.path)
        with loop_device(image, read_only=True) as dev:
            with open(dev, "rb") as f:
                assert f.read() == disk
            scribble(cache)  # the loop device's reads are the kernel's, of the cache file
            with open(dev, "rb") as f:
                assert f.read(1) == b"X"
        cache.unlink()  # (scribbled: the suite's closing fsck would find it)
