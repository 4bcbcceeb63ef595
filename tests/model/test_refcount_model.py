"""The refcount ledger, gc and fsck against a model.

Hypothesis creates images (block maps and directory trees) from a small pool of chunks,
so that chunks, maps and trees are shared across images; clones them, deletes them and
collects garbage, in any order. The model knows, from how it built each image, which
blobs the image needs and which children each blob names. It checks:

  * after every step: fsck finds nothing, and every blob a live image needs has a file;
  * after gc: the files are exactly the blobs the live images need, and every count is
    what the model computes itself (roots + children of the live blobs), without fsck.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from casfs import catalog
from casfs.ids import FIRST_FREE_INO, ROOT_INO, InodeNo
from casfs.kinds import BlobKind, VolumeKind
from casfs.refcount import ledger, logical
from casfs.refcount.fsck import fsck
from casfs.refcount.gc import gc
from casfs.refcount.ledger import Batch
from casfs.repo import Repository
from casfs.snapshots import chunkmap, tree
from casfs.store.ids import ZERO_ID, BlobId

CS = 512
POOL = [bytes([i + 1]) * 300 + bytes([i]) * 212 for i in range(6)]
HOLE = -1
chunk_picks = st.lists(st.integers(HOLE, len(POOL) - 1), min_size=1, max_size=10)


class RefcountModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="casfs-model-"))
        self.repo = Repository.init(self.dir / "store")
        self.live: dict[str, tuple[BlobId, frozenset[BlobId]]] = {}  # image -> (root, needs)
        self.kids: dict[BlobId, Counter[BlobId]] = {}  # blob -> children it names
        self.n = 0

    def teardown(self) -> None:
        self.repo.close()
        shutil.rmtree(self.dir)

    # -- building, with the model's own account of what was built ------------------

    def _put(self, b: Batch, plain: bytes, kind: BlobKind, kids: list[BlobId]) -> BlobId:
        bid = b.put(plain, kind)
        self.kids[bid] = Counter(k for k in kids if k != ZERO_ID)
        return bid

    def _chunk(self, b: Batch, pick: int) -> BlobId:
        return self._put(b, bytes(CS) if pick == HOLE else POOL[pick], BlobKind.DATA, [])

    def _content(self, b: Batch, picks: list[int]) -> tuple[BlobId, int]:
        ids = [self._chunk(b, p) for p in picks]
        if len(ids) == 1:
            return ids[0], CS
        size = len(ids) * CS
        if all(i == ZERO_ID for i in ids):
            return ZERO_ID, size
        return self._put(b, chunkmap.MapRoot(0, CS, size, ids).encode(), BlobKind.MAP_ROOT, ids), size

    def _tree(self, b: Batch, files: list[list[int]], sub: BlobId | None, ino: InodeNo) -> BlobId:
        entries = []
        for i, picks in enumerate(files):
            content, size = self._content(b, picks)
            attrs = tree.Attrs(mode=stat.S_IFREG | 0o644, size=size, ino=InodeNo(100 + i))
            entries.append(tree.Entry(f"f{i}".encode(), attrs, content))
        if sub is not None:
            entries.append(tree.dir_entry(b"sub", 0o755, InodeNo(99), sub))
        t = tree.Tree(tree.Attrs(mode=stat.S_IFDIR | 0o755, ino=ino), CS, entries)
        return self._put(b, t.encode(), BlobKind.TREE, [e.blob for e in t.entries])

    def _needs(self, root: BlobId) -> frozenset[BlobId]:
        seen: set[BlobId] = set()
        todo = [root]
        while todo:
            bid = todo.pop()
            if bid != ZERO_ID and bid not in seen:
                seen.add(bid)
                todo.extend(self.kids[bid])
        return frozenset(seen)

    def _commit(self, b: Batch, kind: VolumeKind, root: BlobId) -> None:
        name = f"img{self.n}"
        self.n += 1

        def row(c: sqlite3.Connection) -> None:
            size = logical.root_size(self.repo.get_meta, kind, root)  # (its blobs are published)
            c.execute(
                "INSERT INTO images (name, kind, phase, root, size, chunk_size, created) "
                "VALUES (?, ?, 'ready', ?, ?, ?, 0)",
                (name, kind, root, size, CS),
            )

        b.commit({root: 1}, then=row)
        self.live[name] = (root, self._needs(root))

    # -- rules -------------------------------------------------------------------------

    @rule(picks=chunk_picks)
    def create_block(self, picks: list[int]) -> None:
        with self.repo.batch() as b:
            ids = [self._chunk(b, p) for p in picks]
            size = len(ids) * CS
            root = self._put(b, chunkmap.MapRoot(0, CS, size, ids).encode(), BlobKind.MAP_ROOT, ids)
            self._commit(b, VolumeKind.BLOCK, root)

    @rule(top=st.lists(chunk_picks, max_size=3), nested=st.lists(chunk_picks, max_size=2))
    def create_dir(self, top: list[list[int]], nested: list[list[int]]) -> None:
        with self.repo.batch() as b:
            sub = self._tree(b, nested, None, FIRST_FREE_INO) if nested else None
            self._commit(b, VolumeKind.DIR, self._tree(b, top, sub, ROOT_INO))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def clone(self, data: st.DataObject) -> None:
        src = data.draw(st.sampled_from(sorted(self.live)))
        name = f"img{self.n}"
        self.n += 1
        with catalog.transaction(self.repo.conn) as c:
            ledger.retain(c, [self.live[src][0]])
            c.execute(
                "INSERT INTO images (name, kind, phase, root, size, chunk_size, created) "
                "SELECT ?, kind, phase, root, size, chunk_size, created FROM images WHERE name = ?",
                (name, src),
            )
        self.live[name] = self.live[src]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.live)))
        with catalog.transaction(self.repo.conn) as c:
            ledger.release(c, [self.live[name][0]])
            c.execute("DELETE FROM images WHERE name = ?", (name,))
        del self.live[name]

    @rule()
    def collect(self) -> None:
        report = gc(self.repo)
        assert report.problems == []
        needed = frozenset().union(*(needs for _, needs in self.live.values()))
        assert set(self.repo.blobs.list()) == needed
        expected: Counter[BlobId] = Counter(root for root, _ in self.live.values())
        for bid in needed:
            expected.update(self.kids[bid])
        stored = {BlobId(bid): refs for bid, refs in self.repo.conn.execute("SELECT id, refs FROM blobs")}
        assert stored == {bid: expected[bid] for bid in needed}

    @invariant()
    def consistent(self) -> None:
        report = fsck(self.repo)
        assert report.clean, report.problems
        files = set(self.repo.blobs.list())
        for _, needs in self.live.values():
            assert needs <= files


RefcountModel.TestCase.settings = settings(
    # ~10 s here; CASFS_MODEL_EXAMPLES=500 for a longer hunt.
    max_examples=int(os.environ.get("CASFS_MODEL_EXAMPLES", "40")),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRefcountModel = RefcountModel.TestCase
