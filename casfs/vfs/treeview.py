"""A read-only view of a directory tree: an image, a snapshot, a read-only volume.

Inode numbers are the tree's own (the root directory is ROOT_INO), so they are the
same in every mount and across snapshots. The tree is immutable, so an entry's
attributes never change and readdir offsets are simply positions in the sorted entry
list. Tree blobs are read and verified as the repository's metadata is, and kept as
their bytes in a small LRU of their own (TreeIndex: each entry decoded when asked for),
not in the repository's metadata cache as well. `_nodes` remembers where each inode
the kernel was told about is (its tree and position, its parent), filled by lookup and
readdir and emptied by forget; attributes are decoded from there when asked for.
"""

from __future__ import annotations

import errno
import stat
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from casfs.errors import Corruption
from casfs.ids import InodeNo
from casfs.repo import Repository
from casfs.snapshots.chunkmap import Content
from casfs.snapshots.tree import TreeIndex
from casfs.store.cache import LRU
from casfs.store.ids import BlobId
from casfs.vfs.api import ROOT_INO, ReadPiece, Stat, enoent, no_xattr
from casfs.vfs.plan import plan_pieces

# Tree blobs kept (their bytes, indexed: see TreeIndex). Not much fewer: listing a
# directory reads each subdirectory's tree too (its attributes live there), and a cache
# smaller than that set evicts the directory being listed between two readdir requests
# (2 MiB made a warm `ls -lR` of /usr/share 6x slower; its trees are 7 MiB).
_TREE_CACHE_BYTES = 16 << 20
_CONTENT_CACHE = 512


@dataclass(frozen=True, slots=True)
class _Node:
    """Where an inode the kernel holds is: entry `index` of the tree blob `tree` (the
    root: -1 of its own), so that its attributes are decoded from there when asked. A
    directory also keeps its subtree's id, and so needs only its own tree to be listed.
    A node is 150 bytes with its dict slot, where keeping the decoded attributes, name
    and data took about 500 (a daemon that served `ls -lR` of /usr/share held 58,000)."""

    tree: BlobId
    index: int
    parent: InodeNo
    subtree: BlobId | None


class TreeView:
    read_only = True
    immutable = True
    rw = None  # not a read/write volume

    def __init__(
        self,
        repo: Repository,
        root: BlobId,
        chunk_size: int,
        next_ino: InodeNo,
        label: str = "",
        tree_cache_bytes: int = _TREE_CACHE_BYTES,
    ) -> None:
        self._repo = repo
        self._get_meta = repo.get_meta
        self.root = root
        self.chunk_size = chunk_size
        self.next_ino = next_ino
        self.label = label
        self._trees: LRU[BlobId, TreeIndex] = LRU(tree_cache_bytes)
        self._contents: OrderedDict[InodeNo, Content] = OrderedDict()
        self._tree(root)  # (a root that is no tree fails here, at once)
        self._nodes: dict[InodeNo, _Node] = {ROOT_INO: _Node(root, -1, ROOT_INO, root)}

    # -- View --------------------------------------------------------------------

    def getattr(self, ino: InodeNo) -> Stat:
        node = self._node(ino)
        if node.subtree is not None:
            return self._dir_stat(node.subtree, ino)
        return self._tree(node.tree).fields(node.index, Stat)[1]

    def lookup(self, parent: InodeNo, name: bytes) -> Stat:
        tree_id = self._dir(parent)
        t = self._tree(tree_id)
        i = t.index_of(name)
        if i is None:
            raise enoent(name.decode(errors="replace"))
        return self._remember(tree_id, t, i, parent)[1]

    def readdir(self, ino: InodeNo, offset: int) -> Iterator[tuple[bytes, Stat, int]]:
        tree_id = self._dir(ino)
        t = self._tree(tree_id)
        for i in range(offset, len(t)):
            name, st = self._remember(tree_id, t, i, ino)
            yield name, st, i + 1

    def readlink(self, ino: InodeNo) -> bytes:
        st, target = self._leaf(ino)
        if not stat.S_ISLNK(st.mode):
            raise OSError(errno.EINVAL, "not a symlink")
        return target

    def read_plan(self, ino: InodeNo, offset: int, size: int) -> list[ReadPiece]:
        content = self._content(ino)
        return plan_pieces(content.chunk_run, content.size, self.chunk_size, offset, size)

    def getxattr(self, ino: InodeNo, name: bytes) -> bytes:
        for key, value in self.getattr(ino).xattrs:
            if key == name:
                return value
        raise no_xattr(name)

    def listxattr(self, ino: InodeNo) -> list[bytes]:
        return [key for key, _ in self.getattr(ino).xattrs]

    def forget(self, ino: InodeNo) -> None:
        if ino != ROOT_INO:
            self._nodes.pop(ino, None)
            self._contents.pop(ino, None)

    # -- for the adapter's logs and the control plane ----------------------------

    def describe(self, ino: InodeNo) -> str:
        """The path of an inode the kernel knows about (its first name, for hardlinks)."""
        parts: list[bytes] = []
        node = self._nodes.get(ino)
        while node is not None and ino != ROOT_INO:
            parts.append(self._tree(node.tree).name(node.index))
            ino = node.parent
            node = self._nodes.get(ino)
        path = b"/".join(reversed(parts)).decode(errors="backslashreplace")
        return f"{self.label}/{path}" if self.label else f"/{path}"

    # -- inside ------------------------------------------------------------------

    def _node(self, ino: InodeNo) -> _Node:
        node = self._nodes.get(ino)
        if node is None:
            # The kernel only asks about inodes it looked up and has not forgotten.
            raise OSError(errno.ESTALE, f"unknown inode {ino}")
        return node

    def _tree(self, bid: BlobId) -> TreeIndex:
        t = self._trees.get(bid)
        if t is None:
            plain = self._repo.read_meta(bid)  # (not cached as bytes twice: the index keeps them)
            t = TreeIndex(plain)
            self._trees.put(bid, t, len(plain))
        return t

    def _dir(self, ino: InodeNo) -> BlobId:
        """The tree id of directory `ino`."""
        subtree = self._node(ino).subtree
        if subtree is None:
            raise OSError(errno.ENOTDIR, "not a directory")
        return subtree

    def _dir_stat(self, tree_id: BlobId, ino: InodeNo) -> Stat:
        """A directory's attributes live in its own tree; its link count is 2 + subdirs."""
        t = self._tree(tree_id)
        return Stat.of(t.attrs.with_(ino=ino, nlink=2 + t.subdirs))

    def _leaf(self, ino: InodeNo) -> tuple[Stat, bytes]:
        """A non-directory's attributes and data (content id or symlink target)."""
        node = self._node(ino)
        if node.subtree is not None:
            raise OSError(errno.EISDIR, "is a directory")
        _, st, data = self._tree(node.tree).fields(node.index, Stat)
        return st, data

    def _remember(self, tree_id: BlobId, t: TreeIndex, i: int, parent: InodeNo) -> tuple[bytes, Stat]:
        """Entry i of directory `parent` (tree `t`): its name and attributes, the kernel
        about to hear of it."""
        name, st, data = t.fields(i, Stat)
        ino = st.ino
        subtree = BlobId(data) if stat.S_ISDIR(st.mode) else None
        if subtree is not None:
            st = self._dir_stat(subtree, ino)
        if ino not in self._nodes:
            self._nodes[ino] = _Node(tree_id, i, parent, subtree)
        return name, st

    def _content(self, ino: InodeNo) -> Content:
        content = self._contents.get(ino)
        if content is not None:
            self._contents.move_to_end(ino)
            return content
        st, content_id = self._leaf(ino)  # (EISDIR for a directory)
        if not stat.S_ISREG(st.mode):
            raise OSError(errno.EINVAL, "not a regular file")
        try:
            content = Content(self._get_meta, BlobId(content_id), st.size, self.chunk_size)
        except Corruption as e:
            raise Corruption(f"{self.describe(ino)}: {e}") from None
        self._contents[ino] = content
        if len(self._contents) > _CONTENT_CACHE:
            self._contents.popitem(last=False)
        return content
