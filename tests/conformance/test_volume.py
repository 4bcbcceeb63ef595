"""One lifecycle suite over both kinds of read/write volume (as containerd runs one
suite per snapshotter): create, write, flush, snapshot, fold, crash, recover. Each test
runs against a directory volume (a file in its root) and a block volume (its one
file), through the same RwView the FUSE adapter drives, the jobs run in this thread."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from casfs import volumes
from casfs.ids import ROOT_INO, InodeNo, SnapshotNo
from casfs.repo import Repository
from casfs.vfs.api import assemble
from casfs.vfs.rw.volume import RwVolume, finish
from casfs.vfs.volume import open_volume
from casfs.volumes.settle import settle
from tests.helpers.volumes import names

SIZE = 1 << 20


@dataclass(frozen=True)
class Kind:
    name: str
    source: volumes.Source
    # The file the suite writes: made in a new directory volume, the disk of a block one.
    file: Callable[[RwVolume], InodeNo]


def _dir_file(v: RwVolume) -> InodeNo:
    try:
        return v.lookup(ROOT_INO, b"data").ino
    except FileNotFoundError:
        return names(v).mknod(ROOT_INO, b"data", stat.S_IFREG | 0o644, 0, 0, 0).ino


KINDS = [
    Kind("dir", volumes.Source(blank_dir=True), _dir_file),
    Kind("block", volumes.Source(blank_block=SIZE), lambda v: ROOT_INO),
]


@pytest.fixture(params=KINDS, ids=lambda k: k.name)
def kind(request: pytest.FixtureRequest) -> Kind:
    k: Kind = request.param
    return k


def make(repo: Repository, kind: Kind, name: str = "v") -> RwVolume:
    volumes.create_volume(repo, name, kind.source)
    return open_volume(repo, name)


def read(v: RwVolume, ino: InodeNo, offset: int = 0, size: int = SIZE) -> bytes:
    return assemble(v.read_plan(ino, offset, size), v.repo.get)


def content(repo: Repository, kind: Kind, name: str, n: int = 256 << 10) -> bytes:
    """The first n bytes of the suite's file in volume (or snapshot) `name`."""
    v = open_volume(repo, name)
    data = read(v, kind.file(v), 0, n)
    v.close(snapshot=False)
    return data


def snapshot(v: RwVolume, label: str | None = None) -> SnapshotNo:
    """As the session takes one: flush, the kind's snapshot job, then any background
    fold it left (a block volume's freeze)."""
    v.flush_sync()
    n = finish(v.prepare_snapshot(label)).snapshot
    while (job := v.prepare_background_fold()) is not None:
        finish(job)
    return n


def clone(repo: Repository, volume: str, n: SnapshotNo, name: str) -> str:
    volumes.create_volume(repo, name, volumes.Source(snapshot=f"{volume}@{n}"))
    return name


def test_written_bytes_read_back_before_and_after_a_flush(repo: Repository, kind: Kind) -> None:
    v = make(repo, kind)
    f = kind.file(v)
    data = os.urandom(100_000)
    assert v.write_sync(f, 4096, data) == len(data)
    assert read(v, f, 4096, len(data)) == data
    assert read(v, f, 0, 4096) == bytes(4096)  # (a hole before it)
    assert v.unsaved() != []
    v.flush_sync()
    assert v.unsaved() == [] and v.dirty_since is None
    assert read(v, f, 4096, len(data)) == data
    v.close()


def test_a_flush_survives_a_crash(repo: Repository, kind: Kind) -> None:
    v = make(repo, kind)
    data = os.urandom(70_000)
    v.write_sync(kind.file(v), 0, data)
    v.flush_sync()
    del v  # the daemon dies: no close, no snapshot
    assert content(repo, kind, "v", len(data)) == data


def test_a_failed_flush_keeps_every_change_for_the_next(repo: Repository, kind: Kind) -> None:
    v = make(repo, kind)
    data = os.urandom(10_000)
    v.write_sync(kind.file(v), 0, data)
    job = v.prepare_flush()
    assert job is not None
    job.abort()  # (as after its run failed: nothing it carried is clean)
    assert v.unsaved() != [] and v.dirty_since is not None
    v.flush_sync()
    del v
    assert content(repo, kind, "v", len(data)) == data


def test_a_snapshot_holds_what_was_written_before_it(repo: Repository, kind: Kind) -> None:
    v = make(repo, kind)
    f = kind.file(v)
    first, second = os.urandom(50_000), os.urandom(50_000)
    v.write_sync(f, 0, first)
    n = snapshot(v, "first")
    v.write_sync(f, 0, second)
    assert read(v, f, 0, len(second)) == second
    v.close()
    assert [(s.n, s.label) for s in volumes.list_snapshots(repo, "v")][:1] == [(n, "first")]
    assert content(repo, kind, clone(repo, "v", n, "c1"), len(first)) == first
    last = volumes.list_snapshots(repo, "v")[-1].n
    assert last > n and content(repo, kind, clone(repo, "v", last, "c2"), len(second)) == second


def test_writes_after_a_fold_build_on_it(repo: Repository, kind: Kind) -> None:
    v = make(repo, kind)
    f = kind.file(v)
    v.write_sync(f, 0, b"a" * 8192)
    snapshot(v)
    v.write_sync(f, 4096, b"b" * 4096)
    assert read(v, f, 0, 8192) == b"a" * 4096 + b"b" * 4096
    v.close()
    assert content(repo, kind, "v", 8192) == b"a" * 4096 + b"b" * 4096


def test_a_crashed_mount_is_recovered_at_rest(repo: Repository, kind: Kind) -> None:
    """What a crash leaves (flushed changes in the overlay) becomes a snapshot when
    the volume is settled at rest, as its unmount would have made."""
    v = make(repo, kind)
    data = os.urandom(30_000)
    v.write_sync(kind.file(v), 0, data)
    v.flush_sync()
    del v
    n = settle(repo, "v")
    assert n is not None
    assert settle(repo, "v") is None  # (nothing left)
    assert content(repo, kind, clone(repo, "v", n, "c"), len(data)) == data


def test_a_snapshot_of_an_unchanged_volume_is_its_content(repo: Repository, kind: Kind) -> None:
    v = make(repo, kind)
    v.write_sync(kind.file(v), 0, b"x" * 4096)
    first = snapshot(v)
    second = snapshot(v)
    v.close(snapshot=False)
    assert second > first
    for n in (first, second):
        assert content(repo, kind, clone(repo, "v", n, f"c{n}"), 4096) == b"x" * 4096
