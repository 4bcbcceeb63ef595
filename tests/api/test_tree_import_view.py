"""The directory importer's worker threads, and what a TreeView answers for xattrs."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import stat
from pathlib import Path

import pytest

from casfs.exporters import export_dir
from casfs.ids import FIRST_FREE_INO, ROOT_INO, InodeNo
from casfs.importers import dirtree
from casfs.importers.treebuilder import TreeBuilder
from casfs.repo import Repository
from casfs.snapshots.tree import Attrs, Tree
from casfs.store.ids import BlobId
from casfs.vfs.api import Stat, assemble
from casfs.vfs.treeview import TreeView
from tests.helpers.trees import compare

pytestmark = pytest.mark.no_fsck(
    "content is imported through the importers alone: its roots are in no image row, "
    "so fsck finds every reference one too many"
)

CHUNK = 65536


def many_files(top: Path) -> None:
    """More files than the importer keeps in flight, some sharing content, some hardlinked."""
    for d in range(12):
        sub = top / f"d{d:02}"
        sub.mkdir(parents=True)
        for i in range(40):
            (sub / f"f{i:03}").write_bytes(b"x" * (i * 977) + bytes([d]))
        (sub / "same").write_bytes(b"shared content\n" * 100)
        os.link(sub / "f001", sub / "f001.link")


def open_under(top: Path) -> list[str]:
    """This process's open files under `top`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(f"{top}/"):
                found.append(target)
    return found


def import_root(repo: Repository, src: Path) -> BlobId:
    with repo.batch() as b:
        built = dirtree.import_dir(b, src, CHUNK)
        b.commit({built.root: 1})
    return built.root


def test_files_stored_by_workers_make_the_same_tree_as_one_thread(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    many_files(src)
    parallel = import_root(repo, src)
    monkeypatch.setattr(dirtree, "_WORKERS", 1)
    monkeypatch.setattr(dirtree, "_INFLIGHT", 1)
    assert import_root(repo, src) == parallel
    out = tmp_path / "out"
    export_dir(repo.get, parallel, CHUNK, out)
    assert compare(src, out) == []


@pytest.mark.parametrize("name", [b"d05/f017", b"d05/f000", b"big/huge"])
def test_a_file_failing_in_a_worker_fails_the_import(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: bytes
) -> None:
    """A small file read in a group, an empty one, one read chunk by chunk."""
    src = tmp_path / "src"
    many_files(src)
    (src / "big").mkdir()
    (src / "big" / "huge").write_bytes(os.urandom(3 * CHUNK + 5))
    real = dirtree._open

    def failing(path: bytes, flags: int) -> int:
        if path.endswith(name):
            raise OSError(errno.EIO, "unreadable")
        return real(path, flags)

    monkeypatch.setattr(dirtree, "_open", failing)
    with repo.batch() as b, pytest.raises(OSError, match="unreadable"):
        dirtree.import_dir(b, src, CHUNK)
    assert open_under(src) == []  # the group's files opened before it are closed


@pytest.mark.parametrize("fails", [False, True])
def test_the_collector_is_back_as_it_was_after_an_import(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    src = tmp_path / "src"
    many_files(src)
    seen: list[bool] = []
    real = dirtree._open

    def watched(path: bytes, flags: int) -> int:
        seen.append(gc.isenabled())
        if fails and path.endswith(b"f017"):
            raise OSError(errno.EIO, "unreadable")
        return real(path, flags)

    monkeypatch.setattr(dirtree, "_open", watched)
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            with repo.batch() as b, contextlib.suppress(OSError):
                dirtree.import_dir(b, src, CHUNK)
            assert gc.isenabled() == enabled
        finally:
            gc.enable()
    assert seen and not any(seen)


def odd_sizes(top: Path) -> None:
    """Files around the chunk size, empty, all zeros, with holes, repeated: stored
    together in a group or one by one, they must get the same ids."""
    top.mkdir()
    sizes = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 5 * CHUNK + 7]
    for i, n in enumerate(sizes):
        (top / f"r{i}").write_bytes(os.urandom(n))
        (top / f"z{i}").write_bytes(bytes(n))
        (top / f"r{i}.again").write_bytes((top / f"r{i}").read_bytes())
        with open(top / f"h{i}", "wb") as f:  # a hole, then a byte at the end
            f.truncate(n)
            if n:
                f.seek(n - 1)
                f.write(b"x")


@pytest.mark.parametrize(("files", "size"), [(1, 1), (3, 1 << 20), (64, 10)])
def test_grouping_files_does_not_change_the_tree(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: int, size: int
) -> None:
    src = tmp_path / "src"
    odd_sizes(src)
    grouped = import_root(repo, src)
    monkeypatch.setattr(dirtree, "_GROUP_FILES", files)
    monkeypatch.setattr(dirtree, "_GROUP_BYTES", size)
    assert import_root(repo, src) == grouped
    out = tmp_path / "out"
    export_dir(repo.get, grouped, CHUNK, out)
    assert compare(src, out) == []
    # Each file's id is the one it gets stored alone, chunk by chunk.
    with repo.batch() as batch:
        b = TreeBuilder(batch, CHUNK)
        for e in Tree.decode(repo.get(grouped)).entries:
            path = os.fsencode(src) + b"/" + e.name
            alone = b.put_content(dirtree._pieces(path, e.attrs.size, CHUNK, None))
            assert (e.data, e.attrs.size) == alone, e.name


# -- TreeView.getxattr ---------------------------------------------------------------


@pytest.fixture
def view(repo: Repository) -> TreeView:
    acl = ((b"system.posix_acl_access", b"\x02\x00\x00\x00"), (b"user.note", b"kept"))
    with repo.batch() as batch:
        b = TreeBuilder(batch, CHUNK)
        b.add_file((b"marked",), Attrs(mode=stat.S_IFREG | 0o644, xattrs=acl), [b"a"])
        b.add_file((b"plain",), Attrs(mode=stat.S_IFREG | 0o644), [b"b"])
        built = b.finish()
        batch.commit({built.root: 1})
    return TreeView(repo, built.root, CHUNK, InodeNo(FIRST_FREE_INO))


def test_an_entrys_own_label_or_acl_is_answered(view: TreeView) -> None:
    ino = view.lookup(ROOT_INO, b"marked").ino
    assert view.getxattr(ino, b"system.posix_acl_access") == b"\x02\x00\x00\x00"
    assert view.getxattr(ino, b"user.note") == b"kept"
    assert view.listxattr(ino) == [b"system.posix_acl_access", b"user.note"]


@pytest.mark.parametrize(
    "name", [b"security.selinux", b"system.posix_acl_access", b"system.posix_acl_default"]
)
def test_a_missing_label_or_acl_is_not_supported_so_ls_stops_asking(view: TreeView, name: bytes) -> None:
    for entry in (b"plain", b"marked"):
        ino = view.lookup(ROOT_INO, entry).ino
        if entry == b"marked" and name == b"system.posix_acl_access":
            continue
        with pytest.raises(OSError) as e:
            view.getxattr(ino, name)
        assert e.value.errno == errno.EOPNOTSUPP
    with pytest.raises(OSError) as e:
        view.getxattr(ROOT_INO, name)
    assert e.value.errno == errno.EOPNOTSUPP


def test_other_missing_attributes_are_enodata(view: TreeView) -> None:
    ino = view.lookup(ROOT_INO, b"plain").ino
    for name in (b"user.note", b"security.capability", b"trusted.x"):
        with pytest.raises(OSError) as e:
            view.getxattr(ino, name)
        assert e.value.errno == errno.ENODATA


def test_readdir_lookup_and_getattr_agree(view: TreeView) -> None:
    listed = {name: st for name, st, _ in view.readdir(ROOT_INO, 0)}
    assert set(listed) == {b"marked", b"plain"}
    for name, st in listed.items():
        assert view.lookup(ROOT_INO, name) == st
        assert view.getattr(st.ino) == st
    assert view.getattr(ROOT_INO).nlink == 2


# -- TreeView without its tree cache --------------------------------------------------


Answers = tuple[Stat, bytes | None, list[bytes], str]


def walk(view: TreeView) -> dict[str, Answers]:
    """Everything a mount can ask of a view, by path: attributes, link target, bytes,
    xattrs and the view's own name for the inode; and each answer asked twice."""
    seen: dict[str, Answers] = {}

    def visit(ino: InodeNo, path: str) -> None:
        for name, st, _ in view.readdir(ino, 0):
            sub = f"{path}/{name.decode()}"
            assert view.lookup(ino, name) == st == view.getattr(st.ino)
            body = None
            if stat.S_ISLNK(st.mode):
                body = view.readlink(st.ino)
            elif stat.S_ISREG(st.mode):
                body = assemble(view.read_plan(st.ino, 0, st.size + 1), view._repo.get)
            seen[sub] = (st, body, view.listxattr(st.ino), view.describe(st.ino))
            if st.is_dir:
                visit(InodeNo(st.ino), sub)

    visit(ROOT_INO, "")
    return seen


def test_a_view_that_keeps_no_tree_answers_as_one_that_keeps_them_all(
    repo: Repository, tmp_path: Path
) -> None:
    """Inodes are remembered by where their entry is, and read again from the store
    once their tree has left the cache: the answers must not change."""
    src = tmp_path / "src"
    many_files(src)
    (src / "d03" / "deeper" / "still").mkdir(parents=True)
    (src / "d03" / "deeper" / "still" / "leaf").write_text("leaf\n")
    os.symlink("../d01/f002", src / "d03" / "link")
    os.setxattr(src / "d02" / "f003", "user.kept", b"value")
    root = import_root(repo, src)
    cached = walk(TreeView(repo, root, CHUNK, InodeNo(FIRST_FREE_INO)))
    uncached = TreeView(repo, root, CHUNK, InodeNo(FIRST_FREE_INO), tree_cache_bytes=0)
    assert walk(uncached) == cached
    assert cached["/d03/link"][1] == b"../d01/f002"
    assert cached["/d03/deeper/still/leaf"][1] == b"leaf\n"
    assert cached["/d02/f003"][2] == [b"user.kept"]
    assert cached["/d07/f001.link"][0] == cached["/d07/f001"][0]  # hardlinks: one inode
    # forgotten, an inode is unknown (ESTALE) until looked up again
    ino = cached["/d05/f010"][0].ino
    d05 = uncached.lookup(ROOT_INO, b"d05").ino
    uncached.forget(ino)
    assert d05 != ino
    with pytest.raises(OSError) as e:
        uncached.getattr(ino)
    assert e.value.errno == errno.ESTALE
    assert uncached.lookup(InodeNo(d05), b"f010") == cached["/d05/f010"][0]
    assert uncached.getattr(ino) == cached["/d05/f010"][0]
