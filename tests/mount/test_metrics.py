"""A mount's Prometheus metrics, scraped during a workload and parsed with
prometheus_client's own parser: the counters move as the workload does."""

from __future__ import annotations

import errno
import os
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from casfs import images, volumes
from casfs.ids import ChunkNo
from casfs.repo import Repository
from casfs.snapshots.chunkmap import Content
from casfs.snapshots.tree import Tree
from casfs.store.ids import BlobId
from tests.helpers import blobs as blob_files
from tests.helpers.cli import fails, js, out
from tests.helpers.mount import mounted

CHUNK = 64 << 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


@pytest.mark.no_fsck("a blob is corrupted on purpose")
def test_metrics_move_with_the_workload(repo: Repository, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(4 * CHUNK)
    (src / "f.bin").write_bytes(data)
    (src / "g.bin").write_bytes(os.urandom(2 * CHUNK))
    images.import_image(repo, "tree", src, chunk_size=CHUNK)
    volumes.create_volume(repo, "vol", volumes.Source(blank_dir=True))
    root = BlobId(bytes.fromhex(images.get_image(repo, "tree").root or ""))
    entry = Tree.decode(repo.get(root)).find(b"g.bin")
    assert entry is not None
    blob_files.corrupt(repo, Content(repo.get, entry.blob, entry.attrs.size, CHUNK).chunk(ChunkNo(0)))
    port = free_port()
    # (the bytes the daemon serves: with passthrough the kernel reads and writes these
    # files itself, counted nowhere; test_passthrough_dir checks that it does)
    extra = ["--metrics", f"127.0.0.1:{port}"]
    with mounted(repo.path, tmp_path / "mnt", extra=extra, passthrough=False) as m:
        before = scrape(port)
        assert (m.path / "images/tree/f.bin").read_bytes() == data
        (m.path / "volumes/vol/new").write_bytes(os.urandom(10_000))
        os.setxattr(m.path / "volumes/vol", "user.casfs.snapshot", b"")  # a fold, counted
        with pytest.raises(OSError) as err:
            (m.path / "images/tree/g.bin").read_bytes()
        assert err.value.errno == errno.EIO
        after = scrape(port)
        status = js(repo.path, "status", "--json")
        (shown,) = status["mounts"]
        assert shown["mountpoint"] == str(m.path) and shown["pid"] == m.pid
        assert shown["metrics"]["casfs_read_bytes_total"] >= len(data)
        assert (status["images"], status["volumes"], status["damaged"]) == (1, 1, 1)
        assert "corrupt reads" in out(repo.path, "status")
    assert js(repo.path, "status", "--json")["mounts"] == []
    mount = str(tmp_path / "mnt")
    grew = {
        name: value(after, name, mount=mount) - value(before, name, mount=mount)
        for name in (
            "casfs_read_bytes_total",
            "casfs_written_bytes_total",
            "casfs_chunk_cache_misses_total",
            "casfs_blob_fetches_total",
            "casfs_blob_fetch_errors_total",
            "casfs_corrupt_reads_total",
            "casfs_fold_bytes_total",
            "casfs_fold_seconds_count",
        )
    }
    assert grew["casfs_read_bytes_total"] >= len(data)
    assert grew["casfs_written_bytes_total"] == 10_000
    assert grew["casfs_chunk_cache_misses_total"] >= 4
    assert grew["casfs_blob_fetches_total"] >= 4
    assert grew["casfs_blob_fetch_errors_total"] >= 1
    assert grew["casfs_corrupt_reads_total"] >= 1
    assert grew["casfs_fold_seconds_count"] == 1
    assert grew["casfs_fold_bytes_total"] >= 10_000  # (random bytes: stored as they are)
    reads = value(after, "casfs_fuse_request_seconds_count", mount=mount, op="read")
    assert reads > value(before, "casfs_fuse_request_seconds_count", mount=mount, op="read")
    assert value(after, "casfs_fuse_request_seconds_bucket", mount=mount, op="read", le="+Inf") == reads
    assert value(after, "casfs_volume_bytes", volume="vol", figure="logical") >= 0
    assert ("casfs_queue_jobs", (("state", "running"),)) in after


def test_a_bad_metrics_address_is_refused_before_mounting(repo: Repository, tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    assert "invalid metrics address" in fails(repo.path, 2, "mount", tmp_path / "mnt", "--metrics", "9101")
    assert not os.path.ismount(tmp_path / "mnt")
