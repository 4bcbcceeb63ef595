"""Builds a directory image from entries added by path, in any order.

Paths are tuples of name components (bytes), () being the root. Every non-directory
is a Node; hardlinks are the same Node placed under several names. Nothing but file
content touches the batch until finish(), which numbers inodes and writes the trees.

Inode numbers depend only on the finished namespace, not on the order entries were
added: the root is 1, then a depth-first walk in name order numbers each directory
and each Node at its first link. So a tree imported from a directory and from a tar
of it gives the same blobs.

ctime cannot be restored by any exporter, so every entry's ctime is its mtime: the
same tree imported twice, or re-imported after an export, gives the same blobs.
"""

from __future__ import annotations

import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from casfs.errors import UsageError
from casfs.ids import NO_INO, InodeNo
from casfs.importers import Built
from casfs.kinds import BlobKind
from casfs.refcount.ledger import Batch
from casfs.snapshots import chunkmap, tree
from casfs.store.ids import ZERO_ID, BlobId

Parts = tuple[bytes, ...]
# A piece of file content: bytes, or the length of a run of zeros (a hole).
Piece = bytes | int

IMPLIED_DIR = tree.Attrs(mode=stat.S_IFDIR | 0o755)
# A file's chunks stored at once: one catalog look-up and one staging call for the run,
# as dirtree's groups of small files have (a /usr/share copy: 7,600 chunks in 1,350 files over a chunk).
_RUN = 16


class PathConflict(UsageError):
    """An entry cannot be placed: a parent is not a directory, or it would replace a
    directory that has entries."""


@dataclass(eq=False)
class Node:
    """A non-directory inode: a file, symlink, device, fifo or socket."""

    attrs: tree.Attrs
    data: bytes = b""  # content id of a file, target of a symlink
    ino: InodeNo = NO_INO
    links: int = 0


@dataclass(eq=False)
class Dir:
    attrs: tree.Attrs
    entries: dict[bytes, Dir | Node] = field(default_factory=dict)
    ino: InodeNo = NO_INO
    tree_id: BlobId | None = None


class TreeBuilder:
    def __init__(self, batch: Batch, chunk_size: int, implied: tree.Attrs = IMPLIED_DIR) -> None:
        self.batch = batch
        self.chunk_size = chunk_size
        self.implied = _normal(implied)
        self.root = Dir(self.implied)

    # -- adding ----------------------------------------------------------------

    def add_dir(self, parts: Parts, attrs: tree.Attrs) -> Dir:
        """Create a directory, or set the attributes of an existing one (keeping its entries)."""
        attrs = _normal(attrs)
        if not parts:
            self.root.attrs = attrs
            return self.root
        parent = self._parent(parts)
        old = parent.entries.get(parts[-1])
        if isinstance(old, Dir):
            old.attrs = attrs
            return old
        d = Dir(attrs)
        parent.entries[parts[-1]] = d
        return d

    def add_file(self, parts: Parts, attrs: tree.Attrs, pieces: Iterable[Piece]) -> Node:
        """Store a file's content from `pieces` (each at most chunk_size long; holes as
        ints) and place it. At most _RUN chunks are held in memory at a time."""
        self._parent(parts)  # refuse before reading content, not after
        content, size = self.put_content(pieces)
        node = Node(_normal(attrs).with_(size=size), content)
        return self.add_link(parts, node)

    def add_file_later(self, parts: Parts, attrs: tree.Attrs) -> Node:
        """Place a file whose content is stored afterwards (set_content, before finish):
        an importer stores files in worker threads while its walk goes on."""
        return self.add_link(parts, Node(_normal(attrs)))

    @staticmethod
    def set_content(node: Node, content: BlobId, size: int) -> None:
        node.data = content
        node.attrs = node.attrs.with_(size=size)

    def add_symlink(self, parts: Parts, attrs: tree.Attrs, target: bytes) -> Node:
        mode = stat.S_IFLNK | stat.S_IMODE(attrs.mode)
        return self.add_link(parts, Node(_normal(attrs).with_(mode=mode, size=len(target)), target))

    def add_special(self, parts: Parts, attrs: tree.Attrs) -> Node:
        """A fifo, socket, or character or block device (attrs.mode says which)."""
        return self.add_link(parts, Node(_normal(attrs).with_(size=0)))

    def add_link(self, parts: Parts, node: Node) -> Node:
        """Place `node` under another name (a hardlink), replacing what was there."""
        if not parts:
            raise PathConflict("the root must be a directory")
        parent = self._parent(parts)
        old = parent.entries.get(parts[-1])
        if isinstance(old, Dir) and old.entries:
            raise PathConflict(f"{_show(parts)} would replace a directory that has entries")
        parent.entries[parts[-1]] = node
        return node

    def remove(self, parts: Parts) -> None:
        """Drop the entry at `parts` (a directory with everything in it), if there is one."""
        parent = self.lookup(parts[:-1])
        if parts and isinstance(parent, Dir):
            parent.entries.pop(parts[-1], None)

    def load(self, root: BlobId, get: Callable[[BlobId], bytes]) -> None:
        """Start from a stored tree (a layer stack imported before): its files keep
        their content ids, hardlinks stay shared; only tree blobs are read."""
        nodes: dict[InodeNo, Node] = {}
        stack: list[tuple[Dir, BlobId]] = [(self.root, root)]
        while stack:
            d, tid = stack.pop()
            t = tree.Tree.decode(get(tid))
            if t.chunk_size != self.chunk_size:
                raise UsageError("a stored tree of another chunk size cannot be extended")
            d.attrs = t.attrs.with_(ino=NO_INO, nlink=1)
            for e in t.entries:
                if e.is_dir:
                    sub = d.entries[e.name] = Dir(self.implied)
                    stack.append((sub, e.blob))
                    continue
                node = nodes.get(e.attrs.ino)
                if node is None:
                    node = nodes[e.attrs.ino] = Node(e.attrs.with_(ino=NO_INO, nlink=1), e.data)
                d.entries[e.name] = node

    def lookup(self, parts: Parts) -> Dir | Node | None:
        """The entry at a path, following no symlinks."""
        cur: Dir | Node = self.root
        for name in parts:
            if not isinstance(cur, Dir):
                return None
            nxt = cur.entries.get(name)
            if nxt is None:
                return None
            cur = nxt
        return cur

    def put_content(self, pieces: Iterable[Piece]) -> tuple[BlobId, int]:
        """Store content chunk by chunk, _RUN chunks at once; returns (content id, size)."""
        ids: list[BlobId] = []
        run: list[bytes] = []
        size = 0
        for piece in pieces:
            if size % self.chunk_size or (not isinstance(piece, int) and len(piece) > self.chunk_size):
                raise ValueError("pieces must be whole chunks, but for a file's last")
            if isinstance(piece, int):
                ids += self.batch.put_many(run)
                run = []
                ids.append(ZERO_ID)
                size += piece
            else:
                run.append(piece)
                size += len(piece)
                if len(run) == _RUN:
                    ids += self.batch.put_many(run)
                    run = []
        ids += self.batch.put_many(run)
        return chunkmap.build_content(self.batch.put_kind, ids, size, self.chunk_size), size

    def put_small(self, contents: Sequence[bytes]) -> list[BlobId]:
        """put_content() of several files of a chunk or less, whole, at once (one catalog
        look-up and one staging call for them all); their content ids."""
        if any(len(c) > self.chunk_size for c in contents):
            raise ValueError("put_small takes files of a chunk or less")
        return self.batch.put_many(contents)

    def _parent(self, parts: Parts) -> Dir:
        """The directory that holds `parts`, creating implied directories on the way."""
        cur = self.root
        for i, name in enumerate(parts[:-1]):
            nxt = cur.entries.get(name)
            if nxt is None:
                nxt = cur.entries[name] = Dir(self.implied)
            elif not isinstance(nxt, Dir):
                kind = "a symlink" if stat.S_ISLNK(nxt.attrs.mode) else "not a directory"
                raise PathConflict(f"{_show(parts)}: its parent {_show(parts[: i + 1])} is {kind}")
            cur = nxt
        return cur

    # -- finishing -------------------------------------------------------------

    def finish(self) -> Built:
        """Number the inodes and write every tree, children before parents. May be called
        again after more entries are added (an OCI image's tree after each layer)."""
        for d in _postorder(self.root):
            for c in d.entries.values():
                if isinstance(c, Node):
                    c.links = 0
        next_ino, size = self._number()
        for d in _postorder(self.root):
            subdirs = sum(isinstance(c, Dir) for c in d.entries.values())
            attrs = d.attrs.with_(ino=d.ino, nlink=2 + subdirs, size=0)
            t = tree.Tree(attrs, self.chunk_size, [_entry(name, c) for name, c in d.entries.items()])
            d.tree_id = self.batch.put(t.encode(), BlobKind.TREE, t.children())
        assert self.root.tree_id is not None
        return Built(self.root.tree_id, size, next_ino)

    def _number(self) -> tuple[InodeNo, int]:
        """Give inode numbers in depth-first name order and count links; returns the
        next free ino and the logical size."""
        ino = 1
        size = 0
        self.root.ino = InodeNo(ino)
        stack: list[Iterator[Dir | Node]] = [_children(self.root)]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
                continue
            if isinstance(child, Dir):
                ino += 1
                child.ino = InodeNo(ino)
                stack.append(_children(child))
                continue
            if child.links == 0:  # first link of this inode
                ino += 1
                child.ino = InodeNo(ino)
                if stat.S_ISREG(child.attrs.mode):
                    size += child.attrs.size
            child.links += 1
        return InodeNo(ino + 1), size


def _children(d: Dir) -> Iterator[Dir | Node]:
    return (d.entries[name] for name in sorted(d.entries))


def _postorder(root: Dir) -> Iterator[Dir]:
    """Every directory after all of its subdirectories (iterative: trees can be deep)."""
    stack: list[tuple[Dir, Iterator[Dir]]] = [(root, _subdirs(root))]
    while stack:
        d, it = stack[-1]
        sub = next(it, None)
        if sub is None:
            stack.pop()
            yield d
        else:
            stack.append((sub, _subdirs(sub)))


def _subdirs(d: Dir) -> Iterator[Dir]:
    return (c for c in d.entries.values() if isinstance(c, Dir))


def _entry(name: bytes, c: Dir | Node) -> tree.Entry:
    if isinstance(c, Dir):
        assert c.tree_id is not None
        return tree.dir_entry(name, c.attrs.mode, c.ino, c.tree_id)
    return tree.Entry(name, c.attrs.with_(ino=c.ino, nlink=c.links), c.data)


def _normal(attrs: tree.Attrs) -> tree.Attrs:
    xattrs = tuple(sorted(attrs.xattrs))
    if attrs.ctime_ns == attrs.mtime_ns and xattrs == attrs.xattrs:
        return attrs  # (as dirtree makes them: one copy fewer per entry)
    return attrs.with_(ctime_ns=attrs.mtime_ns, xattrs=xattrs)


def _show(parts: Parts) -> str:
    return b"/".join(parts).decode("utf-8", "backslashreplace")
