"""The directory importer's worker threads, and what a TreeView answers for xattrs."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.exporters import export_dir
from casfs.ids import FIRST_FREE_INO, ROOT_INO, InodeNo
from casfs.importers import dirtree
from casfs.importers.treebuilder import TreeBuilder
from casfs.repo import Repository
from casfs.snapshots.tree import Attrs
from casfs.store.ids import BlobId
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


def test_a_file_failing_in_a_worker_fails_the_import(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    many_files(src)
    real = dirtree._pieces

    def failing(
        path: bytes, size: int, chunk_size: int, progress: dirtree.Progress | None
    ) -> Iterator[bytes | int]:
        if path.endswith(b"d05/f017"):
            raise OSError(errno.EIO, "unreadable")
        return real(path, size, chunk_size, progress)

    monkeypatch.setattr(dirtree, "_pieces", failing)
    with repo.batch() as b, pytest.raises(OSError, match="unreadable"):
        dirtree.import_dir(b, src, CHUNK)


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
