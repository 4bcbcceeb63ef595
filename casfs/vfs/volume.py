"""A mounted read/write volume: its base root plus a durable overlay, with write-back.

State (all owned by the trio thread; the view lock orders mutations, see docs/developer-notes.md):

  nodes      every inode known in memory: overlay inodes (loaded at open) and base
             inodes met through lookup/readdir (dropped again on forget)
  overlay    the inos that have, or will have at the next flush, an overlay row
  buffers    dirty chunk data, (ino, n) -> bytearray, bounded by the adapter
  chunk_ids  chunks already flushed to the overlay, ino -> {n: id}

Copy-up rule: changing an inode materializes its parent directory (the listing, with
every child copied up), which materializes the grandparent, up to the root. So the
fold (snapshot) rewrites exactly the materialized directories: O(changed), and an
unmaterialized directory's subtree is provably unchanged.

Slow work is split so the trio thread never blocks: prepare_flush() captures a
consistent FlushJob (trio thread), run_flush() hashes, stores and commits it (worker
thread; blob data durable before the catalog transaction that names it), and
apply_flush() records the resulting chunk ids (trio thread). The fold is the same
with FoldJob. Between a prepare and its apply (or abort) the view is *frozen*: no
mutation may run (the adapter holds `lock` around mutations, flushes and snapshots,
and _touch asserts it), and what may still arrive without the lock (a read's atime, a
forget) is deferred until the view thaws.

A change stays dirty until a flush that contains it has committed: prepare_flush
captures the dirty sets without clearing them, apply_flush clears what the job
carried, abort_flush (after a failed run) changes nothing, so the next flush retries
it all. A flush's catalog writes are idempotent, so a retry is always safe.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import trio

from casfs.catalog import transaction
from casfs.catalog.volumes import generation
from casfs.errors import CasfsError
from casfs.repo import Repository
from casfs.snapshots import chunkmap
from casfs.snapshots.kinds import MAP_ROOT
from casfs.snapshots.tree import Entry, Tree
from casfs.store.cache import LRU
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.api import ROOT_INO, Piece, Stat
from casfs.vfs.fold import FlushJob, FoldJob, delete_inode_rows, run_flush, run_fold
from casfs.vfs.nodes import NO_LIMIT, Listing, Node

NAME_MAX = 255
# Decoded base trees, sized by their blob's plaintext (decoded, a few times more).
_TREE_CACHE_BYTES = 16 << 20
_DAY_NS = 86400 * 10**9
XATTR_CREATE = 1
XATTR_REPLACE = 2
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_XATTR_NAMESPACES = (b"user.", b"trusted.", b"security.")


def fs_error(code: int, what: str = "") -> OSError:
    return OSError(code, what or errno.errorcode.get(code, "error"))


class NeedChunks(Exception):
    """A write or truncate needs these chunks' current bytes first (fetch, then retry)."""

    def __init__(self, ids: list[BlobId]) -> None:
        super().__init__(f"{len(ids)} chunks to fetch")
        self.ids = ids


def _now() -> int:
    return time.time_ns()


class VolumeView:
    read_only = False
    immutable = False

    def __init__(
        self, repo: Repository, name: str, claim: Callable[[tuple[object, ...]], None] | None = None
    ) -> None:
        """A view of volume `name`. With `claim`, the caller has not claimed the volume:
        the view reads it as the catalog had it when loaded, and its first change calls
        `claim(generation)` (ensure_writable), which refuses if the volume has changed
        hands or content since (Stale) or another process holds it (Busy)."""
        self.repo = repo
        self.name = name
        self.claim = claim
        self.lock = trio.Lock()
        self._load()

    def _load(self) -> None:
        self.generation = generation(self.repo.conn, self.name)
        row = self.repo.conn.execute(
            "SELECT kind, base, chunk_size, next_ino, size FROM volumes WHERE name = ?", (self.name,)
        ).fetchone()
        if row is None:
            raise CasfsError(f"no volume named {self.name!r}")
        self.kind: str = row[0]
        self.base = BlobId(row[1])
        self.chunk_size: int = row[2]
        self.next_ino: int = row[3]
        self.logical: int = row[4]  # bytes in regular files now (volumes.size as of the last flush)
        self.nodes: dict[int, Node] = {}
        self.overlay: set[int] = set()
        self.dirty_nodes: set[int] = set()
        self.deleted: set[int] = set()
        self.cuts: dict[int, int] = {}
        self.buffers: dict[tuple[int, int], bytearray] = {}
        self.versions: dict[tuple[int, int], int] = {}
        self.dirty_bytes = 0
        self.dirty_since: float | None = None
        self.chunk_ids: dict[int, dict[int, BlobId]] = {}
        self._contents: dict[int, chunkmap.Content | chunkmap.ChunkMap] = {}
        self._trees: LRU[BlobId, Tree] = LRU(_TREE_CACHE_BYTES)
        self._buffered: dict[int, set[int]] = {}  # ino -> chunk numbers in buffers
        self._allocated: dict[BlobId, list[int]] = {}  # base content -> its data chunks
        self._links: _BaseLinks | None = None  # the base's hardlinks, found when first needed
        self._linked: set[int] = set()  # hardlinked inodes whose every directory is materialized
        self._frozen = False  # a flush or fold is between its prepare and its apply/abort
        self._deferred_atime: set[int] = set()  # reads while frozen (relatime, applied at thaw)
        self._deferred_forget: set[int] = set()  # forgets while frozen
        self._load_overlay()
        if ROOT_INO not in self.nodes:
            self.nodes[ROOT_INO] = self._base_root(row[4])

    @property
    def claimed(self) -> bool:
        """This view holds the volume read/write (its changes are the volume's)."""
        return self.claim is None

    def ensure_writable(self) -> None:
        """Before the first change of an unclaimed view: claim the volume, as it was
        when this view read it (the kernel holds inodes of what it read)."""
        if self.claim is not None:
            self.claim(self.generation)
            self.claim = None
            # Unlinked inodes a crashed mount left open: nothing names them (_load_overlay
            # deletes them when the view is claimed from the start).
            for ino in [i for i, n in self.nodes.items() if n.nlink == 0 and i in self.overlay]:
                self._drop_inode(ino)

    # -- loading ---------------------------------------------------------------

    def _load_overlay(self) -> None:
        conn = self.repo.conn
        with transaction(conn) if self.claimed else contextlib.nullcontext(conn):
            # Unlinked inodes that were still open when the daemon died: nothing names them.
            orphans = [
                i
                for (i,) in conn.execute(
                    "SELECT ino FROM overlay_inodes WHERE volume = ? AND nlink = 0", (self.name,)
                )
            ]
            for ino in orphans if self.claimed else ():  # (an unclaimed view writes nothing)
                delete_inode_rows(conn, self.name, ino)
        entries: dict[int, dict[bytes, tuple[int, int]]] = {}
        for d, name, cookie, ino in conn.execute(
            "SELECT dir, name, cookie, ino FROM overlay_entries WHERE volume = ?", (self.name,)
        ):
            entries.setdefault(d, {})[bytes(name)] = (cookie, ino)
        for row in conn.execute("SELECT * FROM overlay_inodes WHERE volume = ?", (self.name,)):
            node = Node.from_row(tuple(row), entries.get(row[1]))
            self.nodes[node.ino] = node
            self.overlay.add(node.ino)
        for ino, n, chunk in conn.execute(
            "SELECT ino, n, chunk FROM overlay_chunks WHERE volume = ?", (self.name,)
        ):
            self.chunk_ids.setdefault(ino, {})[n] = BlobId(chunk)

    def _base_root(self, size: int) -> Node:
        if self.kind == "block":
            st = self.repo.path.stat()
            changed = self._base_time_ns()
            return Node(
                ROOT_INO,
                stat.S_IFREG | 0o644,
                st.st_uid,
                st.st_gid,
                size=size,
                mtime_ns=changed,
                ctime_ns=changed,
                atime_ns=changed,
                base=self.base,
                parent=ROOT_INO,
            )
        return Node.from_tree(self._tree(self.base), self.base, ROOT_INO)

    def _base_time_ns(self) -> int:
        """When the base was made: its snapshot's time (the fold that ended the last
        writes), or the volume's creation. A block volume's mtime until it is written."""
        row = self.repo.conn.execute(
            "SELECT coalesce((SELECT max(created) FROM snapshots WHERE volume = ? AND root = ?), created) "
            "FROM volumes WHERE name = ?",
            (self.name, self.base, self.name),
        ).fetchone()
        return int(row[0] * 1e9)

    def _tree(self, bid: BlobId) -> Tree:
        """A base tree, decoded once: readdir of a big directory comes in many calls, and
        decoding it for each made `ls -lR` of a snapshot-based volume quadratic. Shared:
        callers must not change it."""
        tree = self._trees.get(bid)
        if tree is None:
            plain = self.repo.get_meta(bid)
            tree = Tree.decode(plain)
            self._trees.put(bid, tree, len(plain))
        return tree

    def _base_entries(self, node: Node) -> list[Entry]:
        return self._tree(node.base).entries if node.base != ZERO_ID else []

    def _child_node(self, entry: Entry, parent: int) -> Node:
        """The node for a base entry: the overlay's when it has one (hardlinks!)."""
        known = self.nodes.get(entry.attrs.ino)
        if known is not None:
            return known
        if entry.is_dir:
            node = Node.from_tree(self._tree(entry.blob), entry.blob, parent)
        else:
            node = Node.from_entry(entry, parent, self.chunk_size)
        self.nodes[node.ino] = node
        return node

    def node(self, ino: int) -> Node:
        node = self.nodes.get(ino)
        if node is None:
            raise fs_error(errno.ENOENT, f"inode {ino} is not known")
        return node

    def _dir(self, ino: int) -> Node:
        node = self.node(ino)
        if not node.is_dir:
            raise fs_error(errno.ENOTDIR)
        return node

    # -- copy-up -----------------------------------------------------------------

    def _materialize(self, dir_ino: int) -> Listing:
        node = self._dir(dir_ino)
        if node.listing is not None:
            return node.listing
        if dir_ino != ROOT_INO:
            self._materialize(node.parent)
        listing = Listing()
        for entry in self._base_entries(node):
            child = self._child_node(entry, dir_ino)
            listing.add(entry.name, child.ino)
            self.overlay.add(child.ino)
            self.dirty_nodes.add(child.ino)
        node.listing = listing
        self._touch(dir_ino)
        return listing

    def _touch(self, ino: int) -> None:
        """Mark an inode changed: it (and its parent's listing) go to the overlay."""
        assert not self._frozen, "a mutation ran inside a flush or fold (the view lock was not held)"
        assert self.claim is None, "a change to a volume this view has not claimed (ensure_writable)"
        if ino not in self.overlay:
            node = self.node(ino)
            if ino != ROOT_INO:
                self._materialize(node.parent)
            self.overlay.add(ino)
        known = self.nodes.get(ino)
        if known is not None and known.nlink > 1 and not known.is_dir and ino not in self._linked:
            # (not only at its own copy-up: a listing copies its children up unchanged)
            self._materialize_links(ino)
        self.dirty_nodes.add(ino)
        if self.dirty_since is None:
            self.dirty_since = time.monotonic()

    def _materialize_links(self, ino: int) -> None:
        """A hardlinked base inode changes: materialize every directory that holds one
        of its names, so that the fold rewrites each entry (an unmaterialized directory
        is reused as it was, and would keep the old attributes and content under its
        name). The base's hardlinks are found by one walk of its directories, on the
        first change of a hardlinked file after a fold: O(directories) then, once."""
        self._linked.add(ino)
        if self.kind != "dir":
            return
        if self._links is None:
            self._links = _BaseLinks.scan(self._tree, self.base)
        for d in self._links.dirs.get(ino, ()):
            if self._load_base_dir(d):
                self._materialize(d)

    def _load_base_dir(self, d: int) -> bool:
        """The node of base directory `d`, loaded through its base parents; False if it
        is gone (removed, or moved out of a parent that has changed since)."""
        if d in self.nodes:
            return True
        if d == ROOT_INO or self._links is None or d not in self._links.parents:
            return False
        parent, name = self._links.parents[d]
        if not self._load_base_dir(parent):
            return False
        pnode = self.node(parent)
        if pnode.listing is not None:
            return d in self.nodes  # a materialized listing loaded every child it holds
        entry = self._tree(pnode.base).find(name)
        if entry is None or not entry.is_dir or entry.attrs.ino != d:
            return False
        self._child_node(entry, parent)
        return True

    # -- reading -----------------------------------------------------------------

    def getattr(self, ino: int) -> Stat:
        return self._stat(self.node(ino))

    def lookup(self, parent: int, name: bytes) -> Stat:
        return self._stat(self._lookup_node(parent, name))

    def _stat(self, node: Node) -> Stat:
        st = node.stat()
        if node.is_file:
            st = st.with_(blocks=self._blocks(node))
        return st

    def _blocks(self, node: Node) -> int:
        """512-byte blocks a file occupies, counted by chunk: a chunk holding data counts
        (up to the end of the file), a hole none. So `du` of a sparse file stays small
        and `cp` out of the mount keeps it sparse. Cost: the base's data chunks are
        listed once per content id; then O(changed chunks) per call."""
        cs = self.chunk_size
        count = chunkmap.n_chunks(node.size, cs)
        limit = min(node.base_limit, count)
        base = self._base_allocation(node)
        chunks = bisect.bisect_left(base, limit)
        changed = set(self.chunk_ids.get(node.ino, ())) | self._buffered.get(node.ino, set())
        for n in changed:
            if n < count:
                chunks += self._holds_data(node, n) - (n < limit and _contains(base, n))
        used = chunks * cs
        if count and self._holds_data(node, count - 1):
            used -= count * cs - node.size  # the last chunk ends at the end of the file
        return (used + 511) // 512

    def _holds_data(self, node: Node, n: int) -> bool:
        return n in self._buffered.get(node.ino, ()) or self._chunk_ref(node, n) != ZERO_ID

    def _base_allocation(self, node: Node) -> list[int]:
        if node.base == ZERO_ID or node.base_limit == 0:
            return []
        found = self._allocated.get(node.base)
        if found is None:
            content = self._content(node)
            if isinstance(content, chunkmap.ChunkMap):
                found = content.data_chunks()  # a block volume's disk
            elif content.map is not None:
                found = content.map.data_chunks()
            else:
                found = [0] if content.chunk(0) != ZERO_ID else []
            if len(self._allocated) > 4096:
                self._allocated.clear()
            self._allocated[node.base] = found
        return found

    def _lookup_node(self, parent: int, name: bytes) -> Node:
        pnode = self._dir(parent)
        if len(name) > NAME_MAX:
            raise fs_error(errno.ENAMETOOLONG)
        if pnode.listing is not None:
            ino = pnode.listing.ino(name)
            if ino is None:
                raise fs_error(errno.ENOENT)
            return self.node(ino)
        entry = self._tree(pnode.base).find(name) if pnode.base != ZERO_ID else None
        if entry is None:
            raise fs_error(errno.ENOENT)
        return self._child_node(entry, parent)

    def readdir(self, ino: int, offset: int) -> Iterator[tuple[bytes, Stat, int]]:
        node = self._dir(ino)
        if node.listing is not None:
            for cookie, name, child in node.listing.after(offset):
                yield name, self._stat(self.node(child)), cookie
            return
        entries = self._base_entries(node)
        for index in range(offset, len(entries)):
            entry = entries[index]
            yield entry.name, self._stat(self._child_node(entry, ino)), index + 1

    def readlink(self, ino: int) -> bytes:
        node = self.node(ino)
        if not stat.S_ISLNK(node.mode):
            raise fs_error(errno.EINVAL)
        return node.target

    def forget(self, ino: int) -> None:
        if self._frozen:
            self._deferred_forget.add(ino)  # the running job may hold this inode's rows
            return
        node = self.nodes.get(ino)
        if node is None or ino == ROOT_INO:
            return
        if ino not in self.overlay:
            del self.nodes[ino]  # a base inode: found again from its tree when needed
            self._contents.pop(ino, None)
        elif node.nlink == 0:
            self._drop_inode(ino)

    def _drop_inode(self, ino: int) -> None:
        self.nodes.pop(ino, None)
        self.overlay.discard(ino)
        self.dirty_nodes.discard(ino)
        self.deleted.add(ino)
        self.cuts.pop(ino, None)
        self.chunk_ids.pop(ino, None)
        self._contents.pop(ino, None)
        for key in [k for k in self.buffers if k[0] == ino]:
            self._drop_buffer(key)

    def _base_chunk(self, node: Node, n: int) -> BlobId:
        if node.base == ZERO_ID or n >= node.base_limit:
            return ZERO_ID
        return self._content(node).chunk(n)

    def _content(self, node: Node) -> chunkmap.Content | chunkmap.ChunkMap:
        content = self._contents.get(node.ino)
        if content is None:
            if self.kind == "block":
                content = chunkmap.ChunkMap(self.repo.get_meta, node.base)
            else:
                row = self.repo.conn.execute("SELECT kind FROM blobs WHERE id = ?", (node.base,)).fetchone()
                mapped = row is not None and row[0] == MAP_ROOT
                content = chunkmap.Content(self.repo.get_meta, node.base, node.size, self.chunk_size, mapped)
            self._contents[node.ino] = content
        return content

    def _chunk_ref(self, node: Node, n: int) -> BlobId:
        flushed = self.chunk_ids.get(node.ino)
        if flushed is not None and n in flushed:
            return flushed[n]
        return self._base_chunk(node, n)

    def read_plan(self, ino: int, offset: int, size: int) -> list[Piece]:
        node = self.node(ino)
        if not node.is_file:
            raise fs_error(errno.EISDIR if node.is_dir else errno.EINVAL)
        end = min(offset + size, node.size)
        cs = self.chunk_size
        pieces = []
        pos = offset
        while pos < end:
            n, start = divmod(pos, cs)
            stop = min(cs, end - n * cs)
            buf = self.buffers.get((ino, n))
            if buf is not None:
                pieces.append(Piece(start, stop, data=buf))
            else:
                pieces.append(Piece(start, stop, blob=self._chunk_ref(node, n)))
            pos = n * cs + stop
        return pieces

    def accessed(self, ino: int) -> None:
        """A program read the file (the adapter calls this for reads through a handle
        opened for reading without O_NOATIME; read_plan alone is no access: the digest
        control, read-ahead and the kernel's read-modify-write of a page plan reads too)."""
        if self._frozen:
            # A fold in flight has captured the overlay: marking an inode dirty now would
            # outlive the fold and name an inode whose parent is no longer copied up.
            self._deferred_atime.add(ino)
            return
        node = self.nodes.get(ino)
        if node is not None:
            self._relatime(node)

    def _relatime(self, node: Node) -> None:
        """relatime, for inodes already in the overlay: atime moves when it is older
        than mtime or ctime, or a day old. A base inode is not copied up for a read:
        reading an image-backed volume must not make it 'changed' (and snapshotted)."""
        if node.ino not in self.overlay:
            return
        now = _now()
        if node.atime_ns <= max(node.mtime_ns, node.ctime_ns) or now - node.atime_ns > _DAY_NS:
            node.atime_ns = now
            self.dirty_nodes.add(node.ino)

    def getxattr(self, ino: int, name: bytes) -> bytes:
        value = self.node(ino).xattrs.get(name)
        if value is None:
            raise fs_error(errno.ENODATA)
        return value

    def listxattr(self, ino: int) -> list[bytes]:
        return sorted(self.node(ino).xattrs)

    # -- creating and removing names -----------------------------------------------

    def _check_new_name(self, parent: int, name: bytes) -> Listing:
        if len(name) > NAME_MAX:
            raise fs_error(errno.ENAMETOOLONG)
        if name in (b"", b".", b"..") or b"/" in name:
            raise fs_error(errno.EINVAL)
        listing = self._materialize(parent)
        if name in listing.entries:
            raise fs_error(errno.EEXIST)
        return listing

    def _new_node(
        self, parent: int, name: bytes, mode: int, uid: int, gid: int, rdev: int = 0, target: bytes = b""
    ) -> Node:
        if self.kind == "block":
            raise fs_error(errno.EPERM)
        listing = self._check_new_name(parent, name)
        pnode = self.node(parent)
        if pnode.mode & stat.S_ISGID:
            gid = pnode.gid
            if stat.S_ISDIR(mode):
                mode |= stat.S_ISGID
        now = _now()
        ino = self.next_ino
        self.next_ino += 1
        node = Node(
            ino,
            mode,
            uid,
            gid,
            rdev,
            len(target) if target else 0,
            now,
            now,
            now,
            2 if stat.S_ISDIR(mode) else 1,
            {},
            ZERO_ID,
            NO_LIMIT,
            target,
            parent,
            Listing() if stat.S_ISDIR(mode) else None,
        )
        self.nodes[ino] = node
        listing.add(name, ino)
        self._touch(ino)
        if node.is_dir:
            pnode.nlink += 1
        pnode.mtime_ns = pnode.ctime_ns = now
        self._touch(parent)
        return node

    def mknod(self, parent: int, name: bytes, mode: int, rdev: int, uid: int, gid: int) -> Stat:
        if stat.S_IFMT(mode) == 0:
            mode |= stat.S_IFREG
        if stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
            raise fs_error(errno.EINVAL)
        return self._stat(self._new_node(parent, name, mode, uid, gid, rdev))

    def mkdir(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Stat:
        return self._new_node(parent, name, stat.S_IFDIR | stat.S_IMODE(mode), uid, gid).stat()

    def symlink(self, parent: int, name: bytes, target: bytes, uid: int, gid: int) -> Stat:
        if len(target) > 4095:
            raise fs_error(errno.ENAMETOOLONG)
        return self._new_node(parent, name, stat.S_IFLNK | 0o777, uid, gid, target=target).stat()

    def link(self, ino: int, new_parent: int, new_name: bytes) -> Stat:
        node = self.node(ino)
        if node.is_dir:
            raise fs_error(errno.EPERM)
        listing = self._check_new_name(new_parent, new_name)
        self._touch(ino)
        listing.add(new_name, ino)
        now = _now()
        node.nlink += 1
        node.ctime_ns = now
        pnode = self.node(new_parent)
        pnode.mtime_ns = pnode.ctime_ns = now
        self._touch(new_parent)
        return self._stat(node)

    def unlink(self, parent: int, name: bytes) -> None:
        child = self._lookup_node(parent, name)
        if child.is_dir:
            raise fs_error(errno.EISDIR)
        self._remove_name(parent, name, child)

    def rmdir(self, parent: int, name: bytes) -> None:
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

    def _remove_name(self, parent: int, name: bytes, child: Node) -> None:
        listing = self._materialize(parent)
        self._touch(child.ino)  # while nlink still counts this name (see _materialize_links)
        listing.remove(name)
        now = _now()
        pnode = self.node(parent)
        pnode.mtime_ns = pnode.ctime_ns = now
        if child.is_dir:
            pnode.nlink -= 1
            child.nlink = 0
        else:
            child.nlink -= 1
            if child.nlink == 0 and child.is_file:
                self.logical -= child.size
        child.ctime_ns = now
        self._touch(parent)
        self._touch(child.ino)

    def rename(
        self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, flags: int = 0
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
        self._touch(src.ino)
        old_listing.remove(old_name)
        new_listing.add(new_name, src.ino)
        self._moved(src, old_parent, new_parent)

    def _exchange(self, op: int, on: bytes, src: Node, np: int, nn: bytes, dst: Node) -> None:
        old_listing = self._materialize(op)
        new_listing = self._materialize(np)
        self._touch(src.ino)
        self._touch(dst.ino)
        old_listing.replace(on, dst.ino)
        new_listing.replace(nn, src.ino)
        self._moved(src, op, np)
        self._moved(dst, np, op)

    def _moved(self, node: Node, old_parent: int, new_parent: int) -> None:
        now = _now()
        node.ctime_ns = now
        for p in {old_parent, new_parent}:
            pnode = self.node(p)
            pnode.mtime_ns = pnode.ctime_ns = now
            self._touch(p)
        if node.is_dir and old_parent != new_parent:
            node.parent = new_parent
            self.node(old_parent).nlink -= 1
            self.node(new_parent).nlink += 1

    def _is_ancestor(self, ancestor: int, ino: int) -> bool:
        while True:
            if ino == ancestor:
                return True
            if ino == ROOT_INO:
                return False
            ino = self.node(ino).parent

    # -- attributes ------------------------------------------------------------------

    def setattr(
        self,
        ino: int,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        size: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
        fetched: dict[BlobId, bytes] | None = None,
    ) -> Stat:
        node = self.node(ino)
        if size is not None and size != node.size:
            if self.kind == "block":
                raise fs_error(errno.EPERM, "resize a block volume with the casfs CLI")
            if not node.is_file:
                raise fs_error(errno.EISDIR if node.is_dir else errno.EINVAL)
            self._truncate(node, size, fetched or {})
        now = _now()
        self._touch(ino)
        if mode is not None:
            node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(mode)
        if uid is not None or gid is not None:
            if not node.is_dir and (uid not in (None, node.uid) or gid not in (None, node.gid)):
                # chown clears setuid, and setgid where it means set-group-id (group exec set).
                node.mode &= ~stat.S_ISUID
                if node.mode & stat.S_IXGRP:
                    node.mode &= ~stat.S_ISGID
            node.uid = node.uid if uid is None else uid
            node.gid = node.gid if gid is None else gid
        if atime_ns is not None:
            node.atime_ns = atime_ns
        if mtime_ns is not None:
            node.mtime_ns = mtime_ns
        elif size is not None:
            node.mtime_ns = now
        node.ctime_ns = now
        return self._stat(node)

    def _truncate(self, node: Node, size: int, fetched: dict[BlobId, bytes]) -> None:
        cs = self.chunk_size
        keep = chunkmap.n_chunks(size, cs)
        tail = size % cs
        last = (node.ino, keep - 1)
        ref = ZERO_ID
        if size < node.size and tail and last not in self.buffers:
            ref = self._chunk_ref(node, keep - 1)
            if ref != ZERO_ID and ref not in fetched:
                raise NeedChunks([ref])  # before any change: the retry starts from scratch
        if node.nlink:
            self.logical += size - node.size
        if size < node.size:
            if ref != ZERO_ID:
                self._set_buffer(last, bytearray(fetched[ref]))
            if tail and last in self.buffers:
                buf = self.buffers[last]
                if len(buf) > tail:
                    self.dirty_bytes -= len(buf) - tail
                    del buf[tail:]
                    self.versions[last] = self.versions.get(last, 0) + 1
            for key in [k for k in self.buffers if k[0] == node.ino and k[1] >= keep]:
                self._drop_buffer(key)
            flushed = self.chunk_ids.get(node.ino, {})
            for n in [n for n in flushed if n >= keep]:
                del flushed[n]
            self.cuts[node.ino] = min(self.cuts.get(node.ino, keep), keep)
            node.base_limit = min(node.base_limit, keep)
        node.size = size
        self._touch(node.ino)

    def setxattr(self, ino: int, name: bytes, value: bytes, flags: int = 0) -> None:
        if name.startswith(b"system.posix_acl_"):
            # ACLs are not enforced here (default_permissions checks mode bits only), so
            # refuse them: cp -a and tar then fall back to chmod instead of storing an
            # ACL that silently disagrees with the mode.
            raise fs_error(errno.EOPNOTSUPP, "POSIX ACLs are not supported")
        if not name.startswith(_XATTR_NAMESPACES):
            # The kernel passes every name to FUSE; ext4 refuses unknown namespaces (and
            # system.*) so a tree that cp -a accepted here can be copied back out.
            raise fs_error(errno.EOPNOTSUPP, "unsupported xattr namespace")
        node = self.node(ino)
        if flags & XATTR_CREATE and name in node.xattrs:
            raise fs_error(errno.EEXIST)
        if flags & XATTR_REPLACE and name not in node.xattrs:
            raise fs_error(errno.ENODATA)
        self._touch(ino)
        node.xattrs[name] = value
        node.ctime_ns = _now()

    def removexattr(self, ino: int, name: bytes) -> None:
        node = self.node(ino)
        if name not in node.xattrs:
            raise fs_error(errno.ENODATA)
        self._touch(ino)
        del node.xattrs[name]
        node.ctime_ns = _now()

    # -- writing data ------------------------------------------------------------------

    def write(self, ino: int, offset: int, data: bytes, fetched: dict[BlobId, bytes] | None = None) -> int:
        """Buffer a write. Raises NeedChunks when a partly written chunk's current
        bytes are neither buffered nor in `fetched`: fetch them and call again."""
        node = self.node(ino)
        if not node.is_file:
            raise fs_error(errno.EBADF)
        if self.kind == "block":
            if offset >= node.size and data:
                raise fs_error(errno.ENOSPC, "write past the end of a block volume")
            data = data[: node.size - offset]
        fetched = fetched or {}
        cs = self.chunk_size
        end = offset + len(data)
        missing = []
        for n in range(offset // cs, -(-end // cs)):
            lo, hi = max(offset, n * cs) - n * cs, min(end, (n + 1) * cs) - n * cs
            if (ino, n) in self.buffers or (lo == 0 and (hi == cs or n * cs + hi >= node.size)):
                continue
            ref = self._chunk_ref(node, n)
            if ref != ZERO_ID and ref not in fetched:
                missing.append(ref)
        if missing:
            raise NeedChunks(missing)
        for n in range(offset // cs, -(-end // cs)):
            key = (ino, n)
            lo, hi = max(offset, n * cs) - n * cs, min(end, (n + 1) * cs) - n * cs
            buf = self.buffers.get(key)
            if buf is None:
                if lo == 0 and (hi == cs or n * cs + hi >= node.size):
                    buf = bytearray()
                else:
                    ref = self._chunk_ref(node, n)
                    buf = bytearray(fetched[ref]) if ref != ZERO_ID else bytearray()
                self._set_buffer(key, buf)
            before = len(buf)
            if before < lo:
                buf.extend(bytes(lo - before))
            buf[lo:hi] = data[n * cs + lo - offset : n * cs + hi - offset]
            self.dirty_bytes += len(buf) - before
            self.versions[key] = self.versions.get(key, 0) + 1
        now = _now()
        if end > node.size:
            if node.nlink:
                self.logical += end - node.size
            node.size = end
        node.mtime_ns = node.ctime_ns = now
        self._touch(ino)
        return len(data)

    def write_sync(self, ino: int, offset: int, data: bytes) -> int:
        """write(), fetching needed chunks in this thread (tests, offline tools)."""
        fetched: dict[BlobId, bytes] = {}
        while True:
            try:
                return self.write(ino, offset, data, fetched)
            except NeedChunks as e:
                fetched.update((i, self.repo.get(i)) for i in e.ids)

    def truncate_sync(self, ino: int, size: int) -> Stat:
        fetched: dict[BlobId, bytes] = {}
        while True:
            try:
                return self.setattr(ino, size=size, fetched=fetched)
            except NeedChunks as e:
                fetched.update((i, self.repo.get(i)) for i in e.ids)

    def _set_buffer(self, key: tuple[int, int], buf: bytearray) -> None:
        self.buffers[key] = buf
        self._buffered.setdefault(key[0], set()).add(key[1])
        self.dirty_bytes += len(buf)
        self.versions[key] = self.versions.get(key, 0) + 1
        if self.dirty_since is None:
            self.dirty_since = time.monotonic()

    def _drop_buffer(self, key: tuple[int, int]) -> None:
        buf = self.buffers.pop(key, None)
        if buf is not None:
            self.dirty_bytes -= len(buf)
            chunks = self._buffered.get(key[0])
            if chunks is not None:
                chunks.discard(key[1])
                if not chunks:
                    del self._buffered[key[0]]
        self.versions.pop(key, None)

    # -- describing (logs, and what a failed unmount could not save) -------------------

    def describe(self, ino: int) -> str:
        return f"volume {self.name}: {self.path_of(ino)}"

    def path_of(self, ino: int) -> str:
        """A path naming the inode now, or <inode N> if it has none (unlinked)."""
        parts: list[bytes] = []
        at = ino
        while at != ROOT_INO:
            node = self.nodes.get(at)
            name = None if node is None else self._name_in(node.parent, at)
            if node is None or name is None:
                return f"<inode {ino}>"
            parts.append(name)
            at = node.parent
        return "/" + b"/".join(reversed(parts)).decode(errors="replace")

    def _name_in(self, parent: int, ino: int) -> bytes | None:
        pnode = self.nodes.get(parent)
        if pnode is None or not pnode.is_dir:
            return None
        if pnode.listing is not None:
            return next((n for n, (_, i) in pnode.listing.entries.items() if i == ino), None)
        return next((e.name for e in self._base_entries(pnode) if e.attrs.ino == ino), None)

    def unsaved(self) -> list[tuple[str, int]]:
        """What is not yet committed: (path, buffered bytes) per changed file, symlink
        or device (a directory's own change is its entries', which these name)."""
        held: dict[int, int] = {}
        for (ino, _), buf in self.buffers.items():
            held[ino] = held.get(ino, 0) + len(buf)
        for ino in self.dirty_nodes | self.deleted:
            node = self.nodes.get(ino)
            if node is None or not node.is_dir:
                held.setdefault(ino, 0)
        return sorted((self.path_of(ino), n) for ino, n in held.items())

    # -- flushing: prepare (trio thread) / run (worker) / apply (trio thread) ----------

    @property
    def changed(self) -> bool:
        return bool(self.overlay or self.dirty_nodes or self.buffers or self.deleted)

    def prepare_flush(self) -> FlushJob | None:
        """Capture every change not yet committed (the view is frozen until apply_flush
        or abort_flush). Nothing is cleared here: a change stays dirty until committed."""
        self._thaw_deferred()
        if not (self.dirty_nodes or self.buffers or self.deleted or self.cuts):
            return None
        chunks = [
            (ino, n, self._chunk_bytes(ino, n, buf), self.versions.get((ino, n), 0))
            for (ino, n), buf in self.buffers.items()
        ]
        inos = sorted(i for i in self.dirty_nodes if i in self.nodes)
        rows = [self.nodes[i].row(self.name) for i in inos]
        job = FlushJob(chunks, rows, sorted(self.deleted), dict(self.cuts), self.next_ino, self.logical)
        job.inos = set(self.dirty_nodes)
        for ino in inos:  # a changed listing's directory is always dirty (_touch of the parent)
            listing = self.nodes[ino].listing
            if listing is not None:
                whole, present, gone = listing.pending()
                job.listings.append(ino)
                if whole:
                    job.whole_dirs.append(ino)
                job.entries += [(ino, name, cookie, child) for name, cookie, child in present]
                job.gone += [(ino, name) for name in gone]
        self._frozen = True
        return job

    def _chunk_bytes(self, ino: int, n: int, buf: bytearray) -> bytes:
        """A chunk's bytes in canonical form, as an import would store them: the full
        chunk, or up to the end of the file for the last one (so equal data dedups)."""
        node = self.nodes.get(ino)
        want = (
            self.chunk_size if node is None else max(0, min(self.chunk_size, node.size - n * self.chunk_size))
        )
        if len(buf) >= want:
            return bytes(buf[:want])
        return bytes(buf) + bytes(want - len(buf))

    def apply_flush(self, job: FlushJob) -> None:
        """The job committed: what it carried is clean, unless changed again since."""
        self._frozen = False
        self.dirty_nodes -= job.inos
        for ino in job.listings:
            node = self.nodes.get(ino)
            if node is not None and node.listing is not None:
                node.listing.committed()
        self.deleted.difference_update(job.deleted)
        for ino, cut in job.cuts.items():
            if self.cuts.get(ino) == cut:
                del self.cuts[ino]
        for (ino, n), bid in job.ids.items():
            if ino not in self.nodes or n >= self.cuts.get(ino, NO_LIMIT):
                continue
            self.chunk_ids.setdefault(ino, {})[n] = bid
        for ino, n, _, version in job.chunks:
            if self.versions.get((ino, n)) == version:
                self._drop_buffer((ino, n))
        self.dirty_since = time.monotonic() if self.buffers or self.dirty_nodes or self.deleted else None
        self._thaw_deferred()

    def abort_flush(self, job: FlushJob) -> None:
        """The job failed: everything it carried is still dirty (the next flush retries).
        The age clock restarts, so the timer retries after the dirty age, not every tick."""
        self._frozen = False
        self.dirty_since = time.monotonic()
        self._thaw_deferred()

    def _thaw_deferred(self) -> None:
        """Apply what arrived while the view was frozen (reads' atimes, forgets), once
        it no longer is."""
        atimes, self._deferred_atime = self._deferred_atime, set()
        forgets, self._deferred_forget = self._deferred_forget, set()
        for ino in atimes:
            self.accessed(ino)
        for ino in forgets:
            self.forget(ino)

    def flush_sync(self) -> None:
        """prepare, run and apply in one go (tests, and the daemon's exit path)."""
        job = self.prepare_flush()
        if job is not None:
            try:
                run_flush(self.repo, self.name, job)
            except BaseException:
                self.abort_flush(job)
                raise
            self.apply_flush(job)

    async def flush(self) -> None:
        job = self.prepare_flush()
        if job is not None:
            try:
                await trio.to_thread.run_sync(run_flush, self.repo, self.name, job)
            except BaseException:
                self.abort_flush(job)
                raise
            self.apply_flush(job)

    # -- snapshots ---------------------------------------------------------------------

    def prepare_fold(self, label: str | None) -> FoldJob:
        """Call right after a flush, with the lock held: the catalog then matches memory.
        The view is frozen until apply_fold or abort_fold."""
        rows = {i: self.nodes[i].copy() for i in self.overlay if i in self.nodes}
        chunk_ids = {i: dict(c) for i, c in self.chunk_ids.items() if i in rows}
        self._frozen = True
        return FoldJob(rows, chunk_ids, label, self.logical)

    def abort_fold(self, job: FoldJob) -> None:
        """The fold failed: its transaction did not commit, the overlay stays as it was."""
        self._frozen = False
        self._thaw_deferred()

    def apply_fold(self, job: FoldJob) -> None:
        self._frozen = False
        self.base = job.new_root
        for ino in list(self.overlay):
            node = self.nodes.get(ino)
            if node is None:
                continue
            if node.nlink == 0:
                continue  # unlinked but open: stays in memory only, its data still buffered below
            node.base = job.bases.get(ino, node.base)
            # A file's parent goes stale when it moves or loses a name (only a directory's
            # is kept up to date); the next copy-up must materialize where it is now.
            node.parent = job.parents.get(ino, node.parent)
            node.base_limit = NO_LIMIT
            node.listing = None
        self.overlay = {i for i in self.overlay if i in self.nodes and self.nodes[i].nlink == 0}
        self.chunk_ids = {i: c for i, c in self.chunk_ids.items() if i in self.overlay}
        self._contents.clear()
        self._links = None
        self._linked.clear()
        self._thaw_deferred()  # (a read during the fold is now of a base inode: no atime)

    def snapshot_sync(self, label: str | None = None) -> int:
        """flush + fold in this thread; the caller holds a job slot (a fold is heavy work)."""
        self.flush_sync()
        job = self.prepare_fold(label)
        try:
            self._run_fold(job)
        except BaseException:
            self.abort_fold(job)
            raise
        self.apply_fold(job)
        return job.snapshot

    def _run_fold(self, job: FoldJob) -> None:
        run_fold(self.repo, self.name, self.kind, self.base, self.chunk_size, self.next_ino, job)

    async def take_snapshot(self, label: str | None = None) -> int:
        """Wait for a store job slot first, and only then take the lock: writers are not
        stalled behind other processes' imports, only behind the fold itself."""
        from casfs.lifecycle.queue import acquire_slot

        slot = await trio.to_thread.run_sync(acquire_slot, self.repo, f"snapshot {self.name}")
        try:
            async with self.lock:
                self.ensure_writable()  # a snapshot changes the volume: this mount claims it
                await self.flush()
                job = self.prepare_fold(label)
                try:
                    await trio.to_thread.run_sync(self._run_fold, job)
                except BaseException:
                    self.abort_fold(job)
                    raise
                self.apply_fold(job)
                return job.snapshot
        finally:
            slot.release()

    def close(self, snapshot: bool = True) -> int | None:
        """Flush; then, if anything changed since the base, take a snapshot. A view that
        never claimed its volume changed nothing and leaves it as it is."""
        if not self.claimed:
            return None
        self.flush_sync()
        if snapshot and self.overlay:
            from casfs.lifecycle.queue import job_slot

            with job_slot(self.repo, f"snapshot {self.name}"):
                return self.snapshot_sync()
        return None

    @property
    def size_bytes(self) -> int:
        """The volume's logical size now: the disk's, or its regular files' bytes."""
        return self.nodes[ROOT_INO].size if self.kind == "block" else self.logical


@dataclass
class _BaseLinks:
    """Where a base tree's hardlinked files are: ino -> the directories holding their
    names, and each directory's parent and name (to load it without a path)."""

    dirs: dict[int, list[int]]
    parents: dict[int, tuple[int, bytes]]

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


def _contains(ordered: list[int], n: int) -> bool:
    i = bisect.bisect_left(ordered, n)
    return i < len(ordered) and ordered[i] == n
