"""O(1) snapshots of a block volume, without a mount: a snapshot freezes the written
epoch (its number given out at once), writes go on into a new epoch above it, reads see
the newest epoch holding each block, and the fold that follows (in the background, or
after a crash, here) stores exactly what was frozen under that number."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from casfs import images, volumes
from casfs.catalog import blobs as blob_rows
from casfs.catalog import overlay as overlay_rows
from casfs.catalog import volumes as volume_rows
from casfs.exporters import export_raw
from casfs.ids import ROOT_INO, SnapshotNo
from casfs.repo import Repository
from casfs.vfs.api import assemble
from casfs.vfs.frozenview import FrozenBlockView
from casfs.vfs.rw.jobs.frozen_fold import FrozenFold
from casfs.vfs.rw.volume import RwVolume, finish
from casfs.vfs.volume import open_volume
from tests.helpers.volumes import block, freeze_of

CHUNK = 64 << 10
SIZE = 48 * CHUNK + 4096


def clone(repo: Repository, tmp_path: Path) -> tuple[RwVolume, bytearray]:
    data = bytearray(os.urandom(SIZE // 2) + bytes(SIZE - SIZE // 2))
    (tmp_path / "disk.img").write_bytes(data)
    images.import_image(repo, "disk", tmp_path / "disk.img")
    volumes.create_volume(repo, "vm", volumes.Source(image="disk"))
    v = open_volume(repo, "vm")
    block(v)
    return v, data


def scribble(v: RwVolume, ref: bytearray, rnd: random.Random, count: int) -> None:
    for _ in range(count):
        off = rnd.randrange(SIZE)
        payload = rnd.choice([os.urandom, bytes])(rnd.choice([1, 700, 4096, 5000, CHUNK + 9]))
        written = v.write_sync(ROOT_INO, off, payload)
        ref[off : off + written] = payload[:written]


def snapshot_now(v: RwVolume, label: str | None = None) -> SnapshotNo:
    v.flush_sync()
    job = freeze_of(v, label)
    assert job is not None  # only upper writes changed the volume: it can freeze
    return finish(job).snapshot


def whole(v: RwVolume) -> bytes:
    return assemble(v.read_plan(ROOT_INO, 0, SIZE), v.repo.get)


def stored(repo: Repository, n: int, tmp_path: Path) -> bytes:
    (root,) = repo.conn.execute("SELECT root FROM snapshots WHERE volume = 'vm' AND n = ?", (n,)).fetchone()
    export_raw(repo.get, root, tmp_path / f"snap{n}.raw")
    return (tmp_path / f"snap{n}.raw").read_bytes()


def test_frozen_epochs_stack_and_fold_in_order(repo: Repository, tmp_path: Path) -> None:
    v, ref = clone(repo, tmp_path)
    rnd = random.Random(5)
    states = {}
    for label in ("a", "b", "c"):
        scribble(v, ref, rnd, 40)
        n = snapshot_now(v, label)
        states[n] = bytes(ref)
        assert whole(v) == bytes(ref)  # reads go through every frozen epoch
    scribble(v, ref, rnd, 40)
    v.flush_sync()  # (an epoch is named in the catalog from its first sync)
    assert sorted(states) == [1, 2, 3]
    assert [u.snapshot for u in overlay_rows.uppers(repo.conn, "vm")] == [1, 2, 3, None]
    assert repo.conn.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 0  # none folded yet
    assert volumes.get_volume(repo, "vm").snapshots == [1, 2, 3]  # but all three are taken

    # The background fold, one epoch at a time, while writes go on.
    job = v.prepare_background_fold()
    assert job is not None and v.prepare_background_fold() is None  # one at a time
    job.run()
    scribble(v, ref, rnd, 10)
    job.apply()
    assert whole(v) == bytes(ref)
    assert block(v).fold_frozen_sync() == 3
    assert whole(v) == bytes(ref)
    for n, state in states.items():
        assert stored(repo, n, tmp_path) == state
    labels = [s.label for s in volumes.list_snapshots(repo, "vm")]
    assert labels == ["a", "b", "c"]
    assert v.close() == 4
    assert stored(repo, 4, tmp_path) == bytes(ref)


def test_a_crash_with_frozen_epochs_loses_nothing(repo: Repository, tmp_path: Path) -> None:
    v, ref = clone(repo, tmp_path)
    rnd = random.Random(6)
    scribble(v, ref, rnd, 30)
    snapshot_now(v, "kept")
    at_one = bytes(ref)
    scribble(v, ref, rnd, 30)
    v.flush_sync()
    unsynced = bytearray(ref)
    scribble(v, unsynced, rnd, 5)  # never synced: a crash may keep or lose each block
    del v  # the daemon died

    again = open_volume(repo, "vm")
    block(again)
    assert [f.snapshot for f in block(again).uppers.frozen] == [1]
    again.close()
    assert stored(repo, 1, tmp_path) == at_one
    snaps = volumes.list_snapshots(repo, "vm")
    assert [(s.n, s.label, s.folded) for s in snaps] == [(1, "kept", True), (2, None, True)]
    head = stored(repo, 2, tmp_path)
    for b in range(0, SIZE, 4096):  # what was synced is there; an unsynced block is old or new
        assert head[b : b + 4096] in (ref[b : b + 4096], unsynced[b : b + 4096]), b
    assert head != at_one


def test_a_volume_at_rest_with_frozen_epochs_settles_them(repo: Repository, tmp_path: Path) -> None:
    v, ref = clone(repo, tmp_path)
    scribble(v, ref, random.Random(7), 20)
    snapshot_now(v)
    del v
    # Only a frozen epoch, nothing written after it: settling folds it, adds nothing.
    assert volumes.create_snapshot(repo, "vm") == 1
    assert stored(repo, 1, tmp_path) == bytes(ref)
    assert overlay_rows.uppers(repo.conn, "vm") == []


def test_a_snapshot_of_an_unchanged_volume_does_not_wait_for_the_fold_before_it(
    repo: Repository, tmp_path: Path
) -> None:
    """Nothing written since the last snapshot, still frozen: the next one freezes an
    empty epoch (no fold first); both fold to the same disk, and a crash between the
    freeze and the folds loses neither."""
    v, ref = clone(repo, tmp_path)
    scribble(v, ref, random.Random(8), 30)
    assert snapshot_now(v, "first") == 1
    assert snapshot_now(v, "again") == 2  # (snapshot_now asserts it froze: no fold)
    assert [f.snapshot for f in block(v).uppers.frozen] == [1, 2]
    assert repo.conn.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 0
    assert whole(v) == bytes(ref)
    del v  # the daemon died before either fold

    again = open_volume(repo, "vm")
    block(again)
    assert [f.snapshot for f in block(again).uppers.frozen] == [1, 2]
    assert block(again).fold_frozen_sync() == 2
    assert stored(repo, 1, tmp_path) == stored(repo, 2, tmp_path) == bytes(ref)
    labels = [(s.n, s.label) for s in volumes.list_snapshots(repo, "vm")]
    assert labels == [(1, "first"), (2, "again")]
    assert again.close() is None  # nothing written after them: no third snapshot
    assert overlay_rows.uppers(repo.conn, "vm") == []


@pytest.mark.parametrize("seed", [1, 4, 9])
def test_writes_syncs_freezes_folds_and_crashes_against_a_model(
    repo: Repository, tmp_path: Path, seed: int
) -> None:
    """A random sequence, the view reopened for a crash (what a sync acknowledged must
    be there; a block written since may read old or new) and read back after every
    step; a background fold may have committed without its view learning of it."""
    volumes.create_volume(repo, "vm", volumes.Source(blank_block=SIZE))
    v = open_volume(repo, "vm")
    block(v)
    rnd = random.Random(seed)
    acked, cur = bytearray(SIZE), bytearray(SIZE)
    folding = None
    for _ in range(300):
        op = rnd.random()
        if op < 0.6:
            scribble(v, cur, rnd, 1)
        elif op < 0.8:
            v.flush_sync()
            acked[:] = cur
            freeze = freeze_of(v, None) if op >= 0.7 else None
            if freeze is not None:
                finish(freeze)
        elif op < 0.9:
            if folding is None:
                folding = v.prepare_background_fold()
                if folding is not None:
                    folding.run()
            else:
                folding.apply()
                folding = None
        else:
            folding = None
            reopened = open_volume(repo, "vm")
            block(reopened)
            v = reopened
            got = whole(v)
            for b in range(0, SIZE, 4096):
                assert got[b : b + 4096] in (acked[b : b + 4096], cur[b : b + 4096]), b
            acked[:] = cur[:] = got
        assert whole(v) == bytes(cur)


def test_the_disk_file_s_own_row_never_names_its_content(repo: Repository, tmp_path: Path) -> None:
    """An attribute change after a snapshot writes the file's overlay row (with the
    base of that moment); the snapshot's fold then moves the base on. Reopened after a
    crash, the volume reads its content from the new base, not the row's."""
    v, ref = clone(repo, tmp_path)
    scribble(v, ref, random.Random(8), 30)
    snapshot_now(v)
    v.setattr(ROOT_INO, mode=0o600)
    v.flush_sync()  # the row, naming the base before the fold
    job = v.prepare_background_fold()
    assert job is not None
    job.run()  # committed; the daemon dies before applying it
    again = open_volume(repo, "vm")
    block(again)
    assert whole(again) == bytes(ref)
    assert again.getattr(ROOT_INO).mode & 0o777 == 0o600


def test_frozen_snapshots_read_the_same_before_during_and_after_their_folds(
    repo: Repository, tmp_path: Path
) -> None:
    """casfs.vfs.frozenview: each frozen snapshot reads what it froze (its epoch over
    those below and the image's base), through the folds one by one, and then as stored;
    its attributes stay what they were, and its time is the one stored."""
    v, ref = clone(repo, tmp_path)
    rnd = random.Random(9)
    states = {}
    for _ in range(3):
        scribble(v, ref, rnd, 40)
        states[snapshot_now(v)] = bytes(ref)
    scribble(v, ref, rnd, 20)  # the epoch written now: in no snapshot
    v.flush_sync()
    views = {n: FrozenBlockView.open(repo, "vm", n, f"vm@{n}") for n in states}
    stats = {n: view.getattr(ROOT_INO) for n, view in views.items() if view is not None}
    assert FrozenBlockView.open(repo, "vm", SnapshotNo(4), "vm@4") is None  # never taken

    def read(view: FrozenBlockView | None) -> bytes:
        assert view is not None
        return assemble(view.read_plan(ROOT_INO, 0, SIZE + 1), repo.get)

    for n, view in views.items():
        assert read(view) == states[n]
        assert view is not None and view.stored is None and not view.check_folded()
    while (job := FrozenFold.capture(block(v))) is not None:
        finish(job)
        for n, view in views.items():  # (each looks: the oldest epoch it reads went)
            assert read(view) == states[n]
            assert view is not None and view.check_folded() == (n <= job.frozen.snapshot)
            assert view.getattr(ROOT_INO) == stats[n]
    for n, view in views.items():
        assert view is not None and view.stored is not None
        assert view.stored.getattr(ROOT_INO).mtime_ns == stats[n].mtime_ns  # the frozen one's time
    volumes.remove_snapshot(repo, "vm@2")
    assert FrozenBlockView.open(repo, "vm", SnapshotNo(2), "vm@2") is None
    v.close(snapshot=False)


def test_the_disk_file_s_attributes_are_the_volume_s_not_a_change_to_snapshot(
    repo: Repository, tmp_path: Path
) -> None:
    """A block snapshot is a chunk map: an attribute change of the disk file does not
    make it a fold, and the file's row stays over the freeze, the fold at close and the
    reopen; alone it is nothing to settle or to snapshot. Its mtime is the last write's
    after the close, not the explicit one written before the writes."""
    v, ref = clone(repo, tmp_path)
    scribble(v, ref, random.Random(10), 20)
    v.setattr(ROOT_INO, mode=0o600, mtime_ns=10**18)
    first = snapshot_now(v)  # (asserts a freeze)
    scribble(v, ref, random.Random(11), 20)
    written = v.getattr(ROOT_INO).mtime_ns
    assert written > 10**18 and v.close() == first + 1  # a fold, in this thread
    assert not volume_rows.has_overlay(repo.conn, "vm")
    again = open_volume(repo, "vm")
    block(again)
    st = again.getattr(ROOT_INO)
    assert (st.mode & 0o777, st.mtime_ns, st.size) == (0o600, written, SIZE)
    assert whole(again) == bytes(ref)
    assert again.close() is None  # nothing changed
    # Its logical size is still checked (fsck): the row is no pending change.
    assert "volume vm" in {r.what for r in blob_rows.sized(repo.conn)}
