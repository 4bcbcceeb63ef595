"""Kept space figures against a full recount, under random operations on the library.

Hypothesis imports block and directory images from a small pool of chunks (so that
images, volumes and snapshots share and dedup blobs), clones them and their snapshots,
writes block volumes through their read/write view and folds them (close: a snapshot),
snapshots volumes at rest, removes snapshots, volumes and images, collects garbage, and
settles or refreshes the figures, in any order. After every step:

  * no kept figure that is not marked pending differs from a full count
    (refcount.accounts.audit: the same count fsck makes), nor do the blob totals;
  * what the library's readers return (volume_figures, image_figures, snapshot_figures)
    is what is kept, a volume's upper files added;

and after a refresh nothing is pending and every figure is the count.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from casfs import images, volumes
from casfs.catalog import figures as kept
from casfs.catalog import volumes as volume_rows
from casfs.errors import Busy
from casfs.ids import ROOT_INO, SnapshotNo
from casfs.refcount import accounts
from casfs.refcount.fsck import fsck
from casfs.refcount.gc import gc
from casfs.repo import Repository
from casfs.vfs.volume import open_volume

CHUNK = 32 << 10  # a raw image's chunk size
POOL = [bytes([i]) * CHUNK for i in range(1, 5)] + [random.Random(i).randbytes(CHUNK) for i in range(3)]
HOLE = -1
picks = st.lists(st.integers(HOLE, len(POOL) - 1), min_size=1, max_size=8)
NAMES = [f"n{i}" for i in range(5)]


def chunk_bytes(pick: int) -> bytes:
    """A pool chunk (shared across everything made from it), or a hole."""
    if pick == HOLE:
        return bytes(CHUNK)
    return POOL[pick]


class FiguresModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="casfs-figures-"))
        self.repo = Repository.init(self.tmp / "store")
        self.rnd = random.Random(0)
        self.n = 0

    def teardown(self) -> None:
        try:
            report = fsck(self.repo, timeout=0)
            assert report.clean, [p.message for p in report.problems]
        finally:
            self.repo.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def _images(self) -> list[str]:
        return [i.name for i in images.list_images(self.repo)]

    def _volumes(self, kind: str | None = None) -> list[str]:
        return [v.name for v in volumes.list_volumes(self.repo) if kind is None or v.kind == kind]

    def _snapshots(self) -> list[str]:
        return [f"{s.volume}@{s.n}" for s in volume_rows.snapshot_rows(self.repo.conn)]

    # -- operations ------------------------------------------------------------------

    @rule(chunks=picks, fresh=st.booleans())
    def import_block(self, chunks: list[int], fresh: bool) -> None:
        data = b"".join(chunk_bytes(p) for p in chunks)
        if fresh:  # a chunk no other content has
            data += self.rnd.randbytes(1000)
        path = self.tmp / "disk.img"
        path.write_bytes(data)
        images.import_image(self.repo, self._name("img"), path)

    @rule(files=st.lists(picks, min_size=1, max_size=3))
    def import_dir(self, files: list[list[int]]) -> None:
        src = self.tmp / self._name("tree")
        (src / "sub").mkdir(parents=True)
        for i, chunks in enumerate(files):
            (src / "sub" / f"f{i}").write_bytes(b"".join(chunk_bytes(p)[:5000] for p in chunks))
        images.import_image(self.repo, self._name("dimg"), src)

    @precondition(lambda self: self._images() or self._snapshots())
    @rule(d=st.data(), ro=st.booleans())
    def clone(self, d: st.DataObject, ro: bool) -> None:
        sources = [("image", i) for i in self._images()] + [("snapshot", s) for s in self._snapshots()]
        what, name = d.draw(st.sampled_from(sources))
        source = volumes.Source(image=name) if what == "image" else volumes.Source(snapshot=name)
        volumes.create_volume(self.repo, self._name("vol"), source, read_only=ro)

    @rule(size=st.sampled_from([CHUNK, 5 * CHUNK + 7]))
    def blank(self, size: int) -> None:
        volumes.create_volume(self.repo, self._name("blk"), volumes.Source(blank_block=size))

    @precondition(lambda self: self._rw_block())
    @rule(d=st.data(), writes=st.lists(st.tuples(st.integers(0, 9), st.integers(HOLE, 9)), max_size=4))
    def write_and_fold(self, d: st.DataObject, writes: list[tuple[int, int]]) -> None:
        name = d.draw(st.sampled_from(self._rw_block()))
        view = open_volume(self.repo, name)
        size = view.size_bytes
        for chunk, pick in writes:
            offset = chunk * CHUNK % max(size, 1)
            data = chunk_bytes(pick) if pick < len(POOL) else self.rnd.randbytes(CHUNK)
            view.write_sync(ROOT_INO, offset, data[: max(0, size - offset)])
        view.close()  # a fold when anything changed: snapshot n+1

    def _rw_block(self) -> list[str]:
        return [v.name for v in volumes.list_volumes(self.repo) if v.kind == "block" and v.mode == "rw"]

    @precondition(lambda self: self._volumes())
    @rule(d=st.data())
    def snapshot_at_rest(self, d: st.DataObject) -> None:
        volumes.create_snapshot(self.repo, d.draw(st.sampled_from(self._volumes())))

    @precondition(lambda self: self._snapshots())
    @rule(d=st.data())
    def rm_snapshot(self, d: st.DataObject) -> None:
        with contextlib.suppress(Busy):  # a volume was made from it
            volumes.remove_snapshot(self.repo, d.draw(st.sampled_from(self._snapshots())))

    @precondition(lambda self: self._volumes())
    @rule(d=st.data())
    def rm_volume(self, d: st.DataObject) -> None:
        with contextlib.suppress(Busy):
            volumes.remove_volume(self.repo, d.draw(st.sampled_from(self._volumes())))

    @precondition(lambda self: self._images())
    @rule(d=st.data())
    def rm_image(self, d: st.DataObject) -> None:
        with contextlib.suppress(Busy):
            images.remove_image(self.repo, d.draw(st.sampled_from(self._images())))

    @rule()
    def collect(self) -> None:
        gc(self.repo)

    @rule(budget=st.sampled_from([0, 3, 40, None]))
    def settle(self, budget: int | None) -> None:
        accounts.settle(self.repo, None, budget)

    @rule()
    def refresh(self) -> None:
        accounts.refresh(self.repo)
        assert kept.pending(self.repo.conn) == [] and kept.missing(self.repo.conn) == []
        assert accounts.audit(self.repo) == []

    # -- checks ------------------------------------------------------------------------

    @invariant()
    def kept_figures_are_the_counts(self) -> None:
        drifts = accounts.audit(self.repo)
        assert drifts == [], [str(d) for d in drifts]

    @invariant()
    def readers_show_what_is_kept(self) -> None:
        conn = self.repo.conn
        for name in self._volumes():
            f = accounts.volume_figures(self.repo, name, budget=None)
            k = kept.get(conn, kept.volume(name))
            assert (f.stored - f.local, f.written - f.local, f.unique - f.local) == k[:3]
            assert f.pending == k.pending
        for name in self._images():
            f = accounts.image_figures(self.repo, name, budget=None)
            assert (f.stored, f.written, f.unique, f.pending) == kept.get(conn, kept.image(name))[:4]
        for ref in self._snapshots():
            vol, _, n = ref.partition("@")
            f = accounts.snapshot_figures(self.repo, vol, SnapshotNo(int(n)), budget=None)
            assert (f.stored, f.written, f.unique) == kept.get(conn, kept.snapshot(vol, int(n)))[:3]


TestFigures = FiguresModel.TestCase
TestFigures.settings = settings(
    max_examples=int(os.environ.get("CASFS_MODEL_EXAMPLES", "25")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
