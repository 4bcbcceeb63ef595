"""A directory volume's names (casfs.vfs.rw.dirkind holds them): copy-up, hardlinks in
the base, lookup, readdir and the namespace changes (mknod, mkdir, symlink, link,
unlink, rmdir, rename).

Copy-up rule: changing an inode materializes its parent directory (the listing, with
every child copied up), which materializes the grandparent, up to the root. So the
fold (snapshot) rewrites exactly the materialized directories: O(changed), and an
unmaterialized directory's subtree is provably unchanged.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from casfs.ids import InodeNo
from casfs.snapshots.tree import Attrs, Entry, Tree
from casfs.store.cache import LRU
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.api import ROOT_INO, Stat, fs_error
from casfs.vfs.overlay.nodes import NO_LIMIT, Listing, Node
from casfs.vfs.rw.volume import RwVolume, now_ns

NAME_MAX = 255
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
# Decoded base trees, sized by their blob's plaintext (decoded, a few times more).
_TREE_CACHE_BYTES = 16 << 20


class DirNames:
    """A directory volume's names (casfs.vfs.api.Names, and lookup and readdir)."""

    def __init__(self, vol: RwVolume) -> None:
        self.vol = vol
        self._trees: LRU[BlobId, Tree] = LRU(_TREE_CACHE_BYTES)
        self._links: _BaseLinks | None = None  # the base's hardlinks, found when first needed
        self._linked: set[InodeNo] = set()  # hardlinked inodes whose every directory is materialized

    def materialize_up(self, ino: InodeNo) -> None:
        if ino not in self.vol.overlay:
            node = self.vol.node(ino)
            if ino != ROOT_INO:
                self._materialize(node.parent)
            self.vol.overlay.add(ino)
        known = self.vol.nodes.get(ino)
        if known is not None and known.attrs.nlink > 1 and not known.is_dir and ino not in self._linked:
            # (not only at its own copy-up: a listing copies its children up unchanged)
            self._materialize_links(ino)

    def forget_links(self) -> None:
        """The base changed: its hardlinks are found again when next needed."""
        self._links = None
        self._linked.clear()

    def tree(self, bid: BlobId) -> Tree:
        """A base tree, decoded once: readdir of a big directory comes in many calls, and
        decoding it for each made `ls -lR` of a snapshot-based volume quadratic. Shared:
        callers must not change it."""
        tree = self._trees.get(bid)
        if tree is None:
            plain = self.vol.repo.get_meta(bid)
            tree = Tree.decode(plain)
            self._trees.put(bid, tree, len(plain))
        return tree

    def _base_entries(self, node: Node) -> list[Entry]:
        return self.tree(node.base).entries if node.base != ZERO_ID else []

    def _child_node(self, entry: Entry, parent: InodeNo) -> Node:
        """The node for a base entry: the overlay's when it has one (hardlinks!)."""
        known = self.vol.nodes.get(entry.attrs.ino)
        if known is not None:
            return known
        if entry.is_dir:
            node = Node.from_tree(self.tree(entry.blob), entry.blob, parent)
        else:
            node = Node.from_entry(entry, parent)
        self.vol.nodes[node.ino] = node
        return node

    def _dir(self, ino: InodeNo) -> Node:
        node = self.vol.node(ino)
        if not node.is_dir:
            raise fs_error(errno.ENOTDIR)
        return node

    # -- copy-up -----------------------------------------------------------------

    def _materialize(self, dir_ino: InodeNo) -> Listing:
        node = self._dir(dir_ino)
        if node.listing is not None:
            return node.listing
        if dir_ino != ROOT_INO:
            self._materialize(node.parent)
        listing = Listing()
        for entry in self._base_entries(node):
            child = self._child_node(entry, dir_ino)
            listing.add(entry.name, child.ino)
            self.vol.overlay.add(child.ino)
            self.vol.dirty_nodes.add(child.ino)
        node.listing = listing
        self.vol.touch(dir_ino)
        return listing

    def _materialize_links(self, ino: InodeNo) -> None:
        """A hardlinked base inode changes: materialize every directory that holds one
        of its names, so that the fold rewrites each entry (an unmaterialized directory
        is reused as it was, and would keep the old attributes and content under its
        name). The base's hardlinks are found by one walk of its directories, on the
        first change of a hardlinked file after a fold: O(directories) then, once."""
        self._linked.add(ino)
        if self._links is None:
            self._links = _BaseLinks.scan(self.tree, self.vol.base)
        for d in self._links.dirs.get(ino, ()):
            if self._load_base_dir(d):
                self._materialize(d)

    def _load_base_dir(self, d: InodeNo) -> bool:
        """The node of base directory `d`, loaded through its base parents; False if it
        is gone (removed, or moved out of a parent that has changed since)."""
        if d in self.vol.nodes:
            return True
        if d == ROOT_INO or self._links is None or d not in self._links.parents:
            return False
        parent, name = self._links.parents[d]
        if not self._load_base_dir(parent):
            return False
        pnode = self.vol.node(parent)
        if pnode.listing is not None:
            return d in self.vol.nodes  # a materialized listing loaded every child it holds
        entry = self.tree(pnode.base).find(name)
        if entry is None or not entry.is_dir or entry.attrs.ino != d:
            return False
        self._child_node(entry, parent)
        return True

    # -- names ---------------------------------------------------------------------

    def find(self, parent: InodeNo, name: bytes) -> Stat:
        return self.vol.stat(self._lookup_node(parent, name))

    def _lookup_node(self, parent: InodeNo, name: bytes) -> Node:
        pnode = self._dir(parent)
        if len(name) > NAME_MAX:
            raise fs_error(errno.ENAMETOOLONG)
        if pnode.listing is not None:
            ino = pnode.listing.ino(name)
            if ino is None:
                raise fs_error(errno.ENOENT)
            return self.vol.node(ino)
        entry = self.tree(pnode.base).find(name) if pnode.base != ZERO_ID else None
        if entry is None:
            raise fs_error(errno.ENOENT)
        return self._child_node(entry, parent)

    def entries(self, ino: InodeNo, offset: int) -> Iterator[tuple[bytes, Stat, int]]:
        node = self._dir(ino)
        if node.listing is not None:
            for cookie, name, child in node.listing.after(offset):
                yield name, self.vol.stat(self.vol.node(child)), cookie
            return
        entries = self._base_entries(node)
        for index in range(offset, len(entries)):
            entry = entries[index]
            yield entry.name, self.vol.stat(self._child_node(entry, ino)), index + 1

    def path(self, ino: InodeNo) -> str:
        """A path naming the inode now, or <inode N> if it has none (unlinked)."""
        parts: list[bytes] = []
        at = ino
        while at != ROOT_INO:
            node = self.vol.nodes.get(at)
            name = None if node is None else self._name_in(node.parent, at)
            if node is None or name is None:
                return f"<inode {ino}>"
            parts.append(name)
            at = node.parent
        return "/" + b"/".join(reversed(parts)).decode(errors="replace")

    def _name_in(self, parent: InodeNo, ino: InodeNo) -> bytes | None:
        pnode = self.vol.nodes.get(parent)
        if pnode is None or not pnode.is_dir:
            return None
        if pnode.listing is not None:
            return next((n for n, (_, i) in pnode.listing.entries.items() if i == ino), None)
        return next((e.name for e in self._base_entries(pnode) if e.attrs.ino == ino), None)

    # -- creating and removing names -----------------------------------------------

    def _check_new_name(self, parent: InodeNo, name: bytes) -> Listing:
        if len(name) > NAME_MAX:
            raise fs_error(errno.ENAMETOOLONG)
        if name in (b"", b".", b"..") or b"/" in name:
            raise fs_error(errno.EINVAL)
        listing = self._materialize(parent)
        if name in listing.entries:
            raise fs_error(errno.EEXIST)
        return listing

    def _new_node(
        self, parent: InodeNo, name: bytes, mode: int, uid: int, gid: int, rdev: int = 0, target: bytes = b""
    ) -> Node:
        listing = self._check_new_name(parent, name)
        pnode = self.vol.node(parent)
        if pnode.attrs.mode & stat.S_ISGID:
            gid = pnode.attrs.gid
            if stat.S_ISDIR(mode):
                mode |= stat.S_ISGID
        now = now_ns()
        ino = self.vol.next_ino
        self.vol.next_ino = InodeNo(ino + 1)
        nlink = 2 if stat.S_ISDIR(mode) else 1
        attrs = Attrs(mode, uid, gid, rdev, len(target), now, now, now, ino, nlink)
        node = Node(attrs, {}, ZERO_ID, NO_LIMIT, target, parent, Listing() if stat.S_ISDIR(mode) else None)
        self.vol.nodes[ino] = node
        listing.add(name, ino)
        self.vol.touch(ino)
        if node.is_dir:
            pnode.set(nlink=pnode.attrs.nlink + 1)
        pnode.set(mtime_ns=now, ctime_ns=now)
        self.vol.touch(parent)
        return node

    def mknod(self, parent: InodeNo, name: bytes, mode: int, rdev: int, uid: int, gid: int) -> Stat:
        if stat.S_IFMT(mode) == 0:
            mode |= stat.S_IFREG
        if stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
            raise fs_error(errno.EINVAL)
        return self.vol.stat(self._new_node(parent, name, mode, uid, gid, rdev))

    def mkdir(self, parent: InodeNo, name: bytes, mode: int, uid: int, gid: int) -> Stat:
        return self._new_node(parent, name, stat.S_IFDIR | stat.S_IMODE(mode), uid, gid).stat()

    def symlink(self, parent: InodeNo, name: bytes, target: bytes, uid: int, gid: int) -> Stat:
        if len(target) > 4095:
            raise fs_error(errno.ENAMETOOLONG)
        return self._new_node(parent, name, stat.S_IFLNK | 0o777, uid, gid, target=target).stat()

    def link(self, ino: InodeNo, new_parent: InodeNo, new_name: bytes) -> Stat:
        node = self.vol.node(ino)
        if node.is_dir:
            raise fs_error(errno.EPERM)
        listing = self._check_new_name(new_parent, new_name)
        self.vol.touch(ino)
        listing.add(new_name, ino)
        now = now_ns()
        node.set(nlink=node.attrs.nlink + 1)
        node.set(ctime_ns=now)
        pnode = self.vol.node(new_parent)
        pnode.set(mtime_ns=now, ctime_ns=now)
        self.vol.touch(new_parent)
        return self.vol.stat(node)

    def unlink(self, parent: InodeNo, name: bytes) -> None:
        child = self._lookup_node(parent, name)
        if child.is_dir:
            raise fs_error(errno.EISDIR)
        self._remove_name(parent, name, child)

    def rmdir(self, parent: InodeNo, name: bytes) -> None:
        child = self._lookup_node(parent, name)
        if not child.is_dir:
            raise fs_error(errno.ENOTDIR)
        if self._has_entries(child):
            raise fs_error(errno.ENOTEMPTY)
        self._remove_name(parent, name, child)

    def _has_entries(self, node: Node) -> bool:
        if node.listing is not None:
            return bool(node.listing.entries)
        return bool(self._base_entries(node))

    def _remove_name(self, parent: InodeNo, name: bytes, child: Node) -> None:
        listing = self._materialize(parent)
        self.vol.touch(child.ino)  # while nlink still counts this name (see _materialize_links)
        listing.remove(name)
        now = now_ns()
        pnode = self.vol.node(parent)
        pnode.set(mtime_ns=now, ctime_ns=now)
        if child.is_dir:
            pnode.set(nlink=pnode.attrs.nlink - 1)
            child.set(nlink=0)
        else:
            child.set(nlink=child.attrs.nlink - 1)
            if child.attrs.nlink == 0 and child.is_file:
                self.vol.logical -= child.attrs.size
        child.set(ctime_ns=now)
        self.vol.touch(parent)
        self.vol.touch(child.ino)

    def rename(
        self, old_parent: InodeNo, old_name: bytes, new_parent: InodeNo, new_name: bytes, flags: int = 0
    ) -> None:
        if len(new_name) > NAME_MAX:
            raise fs_error(errno.ENAMETOOLONG)
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == RENAME_NOREPLACE | RENAME_EXCHANGE:
            raise fs_error(errno.EINVAL)
        src = self._lookup_node(old_parent, old_name)
        self._dir(new_parent)
        try:
            dst: Node | None = self._lookup_node(new_parent, new_name)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
            dst = None
        if dst is not None and dst.ino == src.ino:
            return  # the same inode: POSIX says do nothing
        if src.is_dir and self._is_ancestor(src.ino, new_parent):
            raise fs_error(errno.EINVAL, "cannot move a directory into itself")
        if dst is not None and dst.is_dir and self._is_ancestor(dst.ino, old_parent) and not flags:
            raise fs_error(errno.ENOTEMPTY)  # the target holds the source (the kernel checks first)
        if flags & RENAME_EXCHANGE:
            if dst is None:
                raise fs_error(errno.ENOENT)
            if dst.is_dir and self._is_ancestor(dst.ino, old_parent):
                raise fs_error(errno.EINVAL)
            self._exchange(old_parent, old_name, src, new_parent, new_name, dst)
            return
        if dst is not None:
            if flags & RENAME_NOREPLACE:
                raise fs_error(errno.EEXIST)
            if src.is_dir and not dst.is_dir:
                raise fs_error(errno.ENOTDIR)
            if dst.is_dir and not src.is_dir:
                raise fs_error(errno.EISDIR)
            if dst.is_dir and self._has_entries(dst):
                raise fs_error(errno.ENOTEMPTY)
            self._remove_name(new_parent, new_name, dst)
        old_listing = self._materialize(old_parent)
        new_listing = self._materialize(new_parent)
        self.vol.touch(src.ino)
        old_listing.remove(old_name)
        new_listing.add(new_name, src.ino)
        self._moved(src, old_parent, new_parent)

    def _exchange(self, op: InodeNo, on: bytes, src: Node, np: InodeNo, nn: bytes, dst: Node) -> None:
        old_listing = self._materialize(op)
        new_listing = self._materialize(np)
        self.vol.touch(src.ino)
        self.vol.touch(dst.ino)
        old_listing.replace(on, dst.ino)
        new_listing.replace(nn, src.ino)
        self._moved(src, op, np)
        self._moved(dst, np, op)

    def _moved(self, node: Node, old_parent: InodeNo, new_parent: InodeNo) -> None:
        now = now_ns()
        node.set(ctime_ns=now)
        for p in {old_parent, new_parent}:
            pnode = self.vol.node(p)
            pnode.set(mtime_ns=now, ctime_ns=now)
            self.vol.touch(p)
        if node.is_dir and old_parent != new_parent:
            node.parent = new_parent
            self.vol.node(old_parent).set(nlink=self.vol.node(old_parent).attrs.nlink - 1)
            self.vol.node(new_parent).set(nlink=self.vol.node(new_parent).attrs.nlink + 1)

    def _is_ancestor(self, ancestor: InodeNo, ino: InodeNo) -> bool:
        while True:
            if ino == ancestor:
                return True
            if ino == ROOT_INO:
                return False
            ino = self.vol.node(ino).parent


@dataclass
class _BaseLinks:
    """Where a base tree's hardlinked files are: ino -> the directories holding their
    names, and each directory's parent and name (to load it without a path)."""

    dirs: dict[InodeNo, list[InodeNo]]
    parents: dict[InodeNo, tuple[InodeNo, bytes]]

    @staticmethod
    def scan(tree_of: Callable[[BlobId], Tree], root: BlobId) -> _BaseLinks:
        links = _BaseLinks({}, {})
        todo = [(ROOT_INO, root)]
        while todo:
            d, bid = todo.pop()
            for entry in tree_of(bid).entries:
                if entry.is_dir:
                    links.parents[entry.attrs.ino] = (d, entry.name)
                    todo.append((entry.attrs.ino, entry.blob))
                elif entry.attrs.nlink > 1:
                    links.dirs.setdefault(entry.attrs.ino, []).append(d)
        return links
