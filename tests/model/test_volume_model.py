"""A read/write volume (without a mount) against a plain directory, under random operations.

Hypothesis drives the same operations on casfs.vfs.volume.open_volume and on a real
directory; after every step the two trees must match (names, types, modes, sizes,
bytes, xattrs, link counts). Flushes, snapshots and crash-restarts (a new view opened
from the catalog after a flush) are operations too, so the overlay's durability and
the fold are checked against the same model. So are store failures: while the store
refuses writes (`chattr +i STORE/tmp`, as a full disk would), or when a fault is
injected into the blob store (casfs.store.faulty: the next stage, publish, or a publish
stopped half-way fails with ENOSPC or EIO), flushes and snapshots must fail and change
nothing durable; a crash then brings back exactly what the last successful flush
acknowledged (file blocks written in place since may keep their new content, as a page
cache keeps a dead process's writes), and the next good flush saves everything since.
At the end (after gc sweeps the orphans a half-done publish leaves): fsck is clean
and nothing holds the store's lock.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from errno import EIO, ENOSPC
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from casfs import volumes
from casfs.ids import InodeNo
from casfs.refcount.fsck import fsck
from casfs.refcount.gc import gc
from casfs.repo import Repository
from casfs.store.faulty import Faults, FaultyBlobStore
from casfs.vfs.api import ROOT_INO, assemble
from casfs.vfs.volume import Volume, open_volume
from tests.helpers.volumes import names

NAMES = st.sampled_from([b"a", b"b", b"c", b"d\nx", b"\xff"])
CHUNK = 64 << 10
BLOCK = 4096
OFFSETS = st.sampled_from([0, 1, 4095, CHUNK - 3, CHUNK, 2 * CHUNK + 17, 5 * CHUNK])
DATA = st.one_of(st.binary(min_size=1, max_size=300), st.sampled_from([b"\0" * CHUNK, b"z" * (CHUNK + 5)]))


def tree_of_dir(root: Path) -> dict[bytes, tuple[object, ...]]:
    out: dict[bytes, tuple[object, ...]] = {}
    base = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st_ = os.lstat(p)
            rel = os.path.relpath(p, base)
            xattrs = tuple(
                sorted(
                    (os.fsencode(x), os.getxattr(p, x, follow_symlinks=False))
                    for x in os.listxattr(p, follow_symlinks=False)
                )
            )
            if stat.S_ISREG(st_.st_mode):
                with open(p, "rb") as f:
                    body: object = f.read()
            elif stat.S_ISLNK(st_.st_mode):
                body = os.readlink(p)
            else:
                body = None
            nlink = st_.st_nlink
            out[rel] = (
                stat.S_IFMT(st_.st_mode),
                stat.S_IMODE(st_.st_mode),
                st_.st_size if body is not None and not stat.S_ISDIR(st_.st_mode) else None,
                body,
                xattrs,
                nlink,
            )
    return out


def tree_of_view(v: Volume, repo: Repository) -> dict[bytes, tuple[object, ...]]:
    out: dict[bytes, tuple[object, ...]] = {}

    def walk(ino: InodeNo, prefix: bytes) -> None:
        for name, s, _ in list(v.readdir(ino, 0)):
            rel = prefix + name
            if stat.S_ISREG(s.mode):
                body: object = assemble(v.read_plan(s.ino, 0, s.size), repo.get)
            elif stat.S_ISLNK(s.mode):
                body = v.readlink(s.ino)
            else:
                body = None
            xattrs = tuple(sorted((n, v.getxattr(s.ino, n)) for n in v.listxattr(s.ino)))
            out[rel] = (
                stat.S_IFMT(s.mode),
                stat.S_IMODE(s.mode),
                s.size if body is not None and not stat.S_ISDIR(s.mode) else None,
                body,
                xattrs,
                s.nlink,
            )
            if stat.S_ISDIR(s.mode):
                walk(s.ino, rel + b"/")

    walk(ROOT_INO, b"")
    return out


class VolumeModel(RuleBasedStateMachine):
    # Where the store keeps its blobs: None, its own directory (tests/s3 runs the same
    # model with a bucket: a fresh s3://BUCKET/PREFIX per example).
    blob_url: Callable[[], str] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="casfs-model-"))
        self.model = self.tmp / "model"
        self.model.mkdir()
        os.chmod(self.model, 0o755)
        url = type(self).blob_url
        self.repo = Repository.init(self.tmp / "store", blob_url=url() if url else None)
        volumes.create_volume(self.repo, "v", volumes.Source(blank_dir=True))
        self.faults = Faults()
        self.repo.blobs = FaultyBlobStore(self.repo.blobs, self.faults)
        self.view = open_volume(self.repo, "v")
        self.durable: Path | None = None  # a copy of the model as of the last flush
        self.failing = False  # the store refuses writes
        # What writes since the last save put in each 4 KiB block of each file: a write
        # into a committed upper file goes in place, so a crash may keep it.
        self.unsaved: dict[InodeNo, dict[int, set[bytes]]] = {}

    def teardown(self) -> None:
        try:
            self.faults.armed.clear()
            self.store_recovers()
            # A publish stopped half-way leaves orphan files (no row names them): gc's to
            # sweep, as after a crash. Busy here if a failed flush leaked the lock.
            gc(self.repo, timeout=0)
            report = fsck(self.repo, timeout=0)
            assert report.clean, [p.message for p in report.problems]
        finally:
            self.repo.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers -----------------------------------------------------------------

    def _dirs(self) -> list[bytes]:
        found = [b""]
        for rel, info in tree_of_dir(self.model).items():
            if info[0] == stat.S_IFDIR:
                found.append(rel + b"/")
        return sorted(found)

    def _files(self) -> list[bytes]:
        return sorted(rel for rel, info in tree_of_dir(self.model).items() if info[0] == stat.S_IFREG)

    def _ino(self, rel: bytes) -> InodeNo:
        ino = ROOT_INO
        for part in [p for p in rel.split(b"/") if p]:
            ino = self.view.lookup(ino, part).ino
        return ino

    def _both(self, model_op, view_op) -> None:  # type: ignore[no-untyped-def]
        try:
            model_op()
        except OSError as e:
            want = e.errno
        else:
            want = None
        try:
            view_op()
        except OSError as e:
            # (not pytest.raises: whether the view must raise is the model's outcome)
            assert e.errno == want, f"view raised {e}, model {want}"  # noqa: PT017
        else:
            assert want is None, f"view succeeded where the model raised errno {want}"

    def _mp(self, rel: bytes) -> bytes:
        return os.path.join(os.fsencode(self.model), rel)

    # -- operations ------------------------------------------------------------------

    @rule(d=st.data(), name=NAMES)
    def create_file(self, d: st.DataObject, name: bytes) -> None:
        parent = d.draw(st.sampled_from(self._dirs()))
        path = self._mp(parent + name)
        self._both(
            lambda: os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)),
            lambda: names(self.view).mknod(self._ino(parent), name, stat.S_IFREG | 0o640, 0, 0, 0),
        )

    @rule(d=st.data(), name=NAMES)
    def mkdir(self, d: st.DataObject, name: bytes) -> None:
        parent = d.draw(st.sampled_from(self._dirs()))
        self._both(
            lambda: os.mkdir(self._mp(parent + name), 0o750),
            lambda: names(self.view).mkdir(self._ino(parent), name, 0o750, 0, 0),
        )

    @precondition(lambda self: self._files())
    @rule(d=st.data(), offset=OFFSETS, data=DATA)
    def write(self, d: st.DataObject, offset: int, data: bytes) -> None:
        rel = d.draw(st.sampled_from(self._files()))
        fd = os.open(self._mp(rel), os.O_RDWR)
        try:
            os.pwrite(fd, data, offset)
            blocks = self.unsaved.setdefault(self._ino(rel), {})
            for b in range(offset // BLOCK, (offset + len(data) - 1) // BLOCK + 1):
                blocks.setdefault(b, set()).add(os.pread(fd, BLOCK, b * BLOCK))
        finally:
            os.close(fd)
        self.view.write_sync(self._ino(rel), offset, data)

    @precondition(lambda self: self._files())
    @rule(d=st.data(), size=OFFSETS)
    def truncate(self, d: st.DataObject, size: int) -> None:
        rel = d.draw(st.sampled_from(self._files()))
        os.truncate(self._mp(rel), size)
        self.view.truncate_sync(self._ino(rel), size)

    @rule(d=st.data(), name=NAMES)
    def unlink(self, d: st.DataObject, name: bytes) -> None:
        parent = d.draw(st.sampled_from(self._dirs()))
        self._both(
            lambda: os.unlink(self._mp(parent + name)),
            lambda: names(self.view).unlink(self._ino(parent), name),
        )

    @rule(d=st.data(), name=NAMES)
    def rmdir(self, d: st.DataObject, name: bytes) -> None:
        parent = d.draw(st.sampled_from(self._dirs()))
        self._both(
            lambda: os.rmdir(self._mp(parent + name)), lambda: names(self.view).rmdir(self._ino(parent), name)
        )

    @rule(d=st.data(), a=NAMES, b=NAMES)
    def rename(self, d: st.DataObject, a: bytes, b: bytes) -> None:
        pa = d.draw(st.sampled_from(self._dirs()))
        pb = d.draw(st.sampled_from(self._dirs()))
        self._both(
            lambda: os.rename(self._mp(pa + a), self._mp(pb + b)),
            lambda: names(self.view).rename(self._ino(pa), a, self._ino(pb), b),
        )

    @precondition(lambda self: self._files())
    @rule(d=st.data(), name=NAMES)
    def link(self, d: st.DataObject, name: bytes) -> None:
        rel = d.draw(st.sampled_from(self._files()))
        parent = d.draw(st.sampled_from(self._dirs()))
        self._both(
            lambda: os.link(self._mp(rel), self._mp(parent + name)),
            lambda: names(self.view).link(self._ino(rel), self._ino(parent), name),
        )

    @rule(d=st.data(), name=NAMES, dest=st.sampled_from([b"a", b"../b", b"/etc/x"]))
    def symlink(self, d: st.DataObject, name: bytes, dest: bytes) -> None:
        parent = d.draw(st.sampled_from(self._dirs()))
        self._both(
            lambda: os.symlink(dest, self._mp(parent + name)),
            lambda: names(self.view).symlink(self._ino(parent), name, dest, 0, 0),
        )

    @precondition(lambda self: self._files())
    @rule(d=st.data(), value=st.binary(max_size=20), mode=st.sampled_from([0o600, 0o4755, 0o644]))
    def attrs(self, d: st.DataObject, value: bytes, mode: int) -> None:
        rel = d.draw(st.sampled_from(self._files()))
        os.setxattr(self._mp(rel), b"user.k", value)
        os.chmod(self._mp(rel), mode)
        ino = self._ino(rel)
        self.view.setxattr(ino, b"user.k", value)
        self.view.setattr(ino, mode=mode)

    @rule()
    def flush(self) -> None:
        self._save(self.view.flush_sync)

    @rule()
    def snapshot(self) -> None:
        # A snapshot is a flush, then a fold: a fold that fails leaves the flush committed.
        # So a failed snapshot may still have saved everything (its flush went through
        # where the one before it had failed): the view then has nothing left to flush.
        self._save(self.view.flush_sync)
        self._save(self.view.snapshot_sync, flushed=lambda: self.view.dirty_since is None)

    def _save(self, how: Callable[[], object], flushed: Callable[[], bool] | None = None) -> None:
        """A save that succeeded made the model durable; one that failed (only while the
        store fails or a fault fired, and only if there was something to write) made
        nothing durable, unless it says its flush half committed (`flushed`)."""
        fired = self.faults.fired
        try:
            how()
        except OSError:
            assert self.failing or self.faults.fired > fired
            if flushed is None or not flushed():
                return
        self._remember_durable()

    @rule(op=st.sampled_from(["stage", "publish", "publish-half"]), code=st.sampled_from([ENOSPC, EIO]))
    def inject(self, op: str, code: int) -> None:
        self.faults.arm(op, code)

    @rule()
    def store_fails(self) -> None:
        if not self.failing:
            subprocess.run(["chattr", "+i", str(self.repo.path / "tmp")], check=True)
            self.failing = True

    @rule()
    def store_recovers(self) -> None:
        if self.failing:
            subprocess.run(["chattr", "-i", str(self.repo.path / "tmp")], check=True)
            self.failing = False

    @precondition(lambda self: self.durable is not None)
    @rule()
    def crash_and_reopen(self) -> None:
        """The daemon dies; what the last flush made durable must come back: exactly,
        but for file blocks written in place since (`_keep_in_place_writes`)."""
        assert self.durable is not None
        self.view = open_volume(self.repo, "v")
        shutil.rmtree(self.model)
        subprocess.run(["cp", "-a", str(self.durable), str(self.model)], check=True)
        self._keep_in_place_writes()

    def _keep_in_place_writes(self) -> None:
        """Each 4 KiB block of a file (within the size its committed row gives) holds
        its durable content or one a write since gave it, as a file system's page cache
        keeps writes a process made before it died; the model takes what the view has."""
        for rel in self._files():
            ino = self._ino(rel)
            with open(self._mp(rel), "r+b") as f:
                want = f.read()
                got = assemble(self.view.read_plan(ino, 0, len(want)), self.repo.get)
                if got == want:
                    continue
                assert len(got) == len(want), rel  # (the size is the row's)
                written = self.unsaved.get(ino, {})
                for b in range(-(-len(want) // BLOCK)):
                    new = got[b * BLOCK : (b + 1) * BLOCK]
                    if new != want[b * BLOCK : (b + 1) * BLOCK]:
                        assert any(c[: len(new)] == new for c in written.get(b, ())), (rel, b)
                f.seek(0)
                f.write(got)

    def _remember_durable(self) -> None:
        copy = self.tmp / "durable"
        shutil.rmtree(copy, ignore_errors=True)
        # cp -a keeps hardlinks, which copytree does not.
        subprocess.run(["cp", "-a", str(self.model), str(copy)], check=True)
        self.durable = copy
        self.unsaved.clear()

    @invariant()
    def same_tree(self) -> None:
        assert tree_of_view(self.view, self.repo) == tree_of_dir(self.model)


TestVolumeModel = VolumeModel.TestCase
TestVolumeModel.settings = settings(
    max_examples=int(os.environ.get("CASFS_MODEL_EXAMPLES", "20")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
