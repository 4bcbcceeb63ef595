"""A read-only view of a directory tree: an image, a snapshot, a read-only volume.

Inode numbers are the tree's own (the root directory is ROOT_INO), so they are the
same in every mount and across snapshots. The tree is immutable, so an entry's
attributes never change and readdir offsets are simply positions in the sorted entry
list. Tree blobs are read and verified as the repository's metadata is; decoded trees
are kept in a small LRU of their own, and not in the repository's metadata cache as
well (that copy of /usr/share's trees was 7 MiB of a daemon's RSS). `_nodes` remembers
what the kernel was told about (ino -> attributes, parent, name), filled by lookup and
readdir and emptied by forget.
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
from casfs.snapshots.tree import Attrs, Entry, Tree
from casfs.store.cache import LRU
from casfs.store.ids import BlobId
from casfs.vfs.api import ROOT_INO, Piece, Stat, enoent, no_xattr
from casfs.vfs.chunks import plan_pieces

# Decoded trees, sized by their blob's plaintext (decoded entries take about five times
# more: /usr/share's 7 MiB of trees, decoded, are 15 MiB of a daemon's RSS). Not much
# smaller: listing a directory decodes each subdirectory's tree too (its attributes
# live there), and a cache smaller than that set evicts the directory being listed
# between two readdir requests (2 MiB made a warm `ls -lR` of /usr/share 6x slower).
_TREE_CACHE_BYTES = 16 << 20
_CONTENT_CACHE = 512


@dataclass(frozen=True, slots=True)
class _Node:
    # A directory's own attributes (from its tree blob), else the entry's; made into the
    # Stat replied once, when the kernel first hears of the inode (a warm `ls -lR`
    # replies every entry again: building a Stat each time was an eighth of its time).
    attrs: Stat
    data: bytes  # subtree id, content id or symlink target (tree.Entry.data)
    parent: InodeNo
    name: bytes


class TreeView:
    read_only = True
    immutable = True
    rw = None  # not a read/write volume

    def __init__(
        self, repo: Repository, root: BlobId, chunk_size: int, next_ino: InodeNo, label: str = ""
    ) -> None:
        self._repo = repo
        self._get_meta = repo.get_meta
        self.root = root
        self.chunk_size = chunk_size
        self.next_ino = next_ino
        self.label = label
        self._trees: LRU[BlobId, Tree] = LRU(_TREE_CACHE_BYTES)
        self._contents: OrderedDict[InodeNo, Content] = OrderedDict()
        top = self._tree(root)
        self._nodes: dict[InodeNo, _Node] = {
            ROOT_INO: _Node(Stat.of(self._dir_attrs(top, ROOT_INO)), root, ROOT_INO, b"")
        }

    # -- View --------------------------------------------------------------------

    def getattr(self, ino: InodeNo) -> Stat:
        return self._node(ino).attrs

    def lookup(self, parent: InodeNo, name: bytes) -> Stat:
        entry = self._dir(parent).find(name)
        if entry is None:
            raise enoent(name.decode(errors="replace"))
        return self._remember(entry, parent)

    def readdir(self, ino: InodeNo, offset: int) -> Iterator[tuple[bytes, Stat, int]]:
        entries = self._dir(ino).entries
        for i in range(offset, len(entries)):
            entry = entries[i]
            yield entry.name, self._remember(entry, ino), i + 1

    def readlink(self, ino: InodeNo) -> bytes:
        node = self._node(ino)
        if not stat.S_ISLNK(node.attrs.mode):
            raise OSError(errno.EINVAL, "not a symlink")
        return node.data

    def read_plan(self, ino: InodeNo, offset: int, size: int) -> list[Piece]:
        content = self._content(ino)
        return plan_pieces(content.chunk, content.size, self.chunk_size, offset, size)

    def getxattr(self, ino: InodeNo, name: bytes) -> bytes:
        for key, value in self._node(ino).attrs.xattrs:
            if key == name:
                return value
        raise no_xattr(name)

    def listxattr(self, ino: InodeNo) -> list[bytes]:
        return [key for key, _ in self._node(ino).attrs.xattrs]

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
            parts.append(node.name)
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

    def _tree(self, bid: BlobId) -> Tree:
        t = self._trees.get(bid)
        if t is None:
            plain = self._repo.read_meta(bid)  # (not cached as bytes too: the tree is)
            t = Tree.decode(plain)
            self._trees.put(bid, t, len(plain))
        return t

    def _dir(self, ino: InodeNo) -> Tree:
        node = self._node(ino)
        if not stat.S_ISDIR(node.attrs.mode):
            raise OSError(errno.ENOTDIR, "not a directory")
        return self._tree(BlobId(node.data))

    @staticmethod
    def _dir_attrs(t: Tree, ino: InodeNo) -> Attrs:
        subdirs = sum(1 for e in t.entries if e.is_dir)
        return t.attrs.with_(ino=ino, nlink=2 + subdirs)

    def _remember(self, entry: Entry, parent: InodeNo) -> Stat:
        ino = entry.attrs.ino
        node = self._nodes.get(ino)
        if node is None:
            attrs = self._dir_attrs(self._tree(BlobId(entry.data)), ino) if entry.is_dir else entry.attrs
            node = self._nodes[ino] = _Node(Stat.of(attrs), entry.data, parent, entry.name)
        return node.attrs

    def _content(self, ino: InodeNo) -> Content:
        content = self._contents.get(ino)
        if content is not None:
            self._contents.move_to_end(ino)
            return content
        node = self._node(ino)
        if not stat.S_ISREG(node.attrs.mode):
            code = errno.EISDIR if stat.S_ISDIR(node.attrs.mode) else errno.EINVAL
            raise OSError(code, "not a regular file")
        try:
            content = Content(self._get_meta, BlobId(node.data), node.attrs.size, self.chunk_size)
        except Corruption as e:
            raise Corruption(f"{self.describe(ino)}: {e}") from None
        self._contents[ino] = content
        if len(self._contents) > _CONTENT_CACHE:
            self._contents.popitem(last=False)
        return content
