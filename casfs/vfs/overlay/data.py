"""A read/write volume's file data and attributes: where each chunk is (a flushed
overlay chunk, the base, a hole), reads described as pieces, st_blocks. Shared by both
kinds (a block volume is one file); each kind writes and truncates its own way."""

from __future__ import annotations

import bisect
import errno
import stat
from abc import abstractmethod
from collections.abc import Callable
from typing import TypeVar, Unpack

from casfs.ids import ChunkNo, InodeNo
from casfs.snapshots import chunkmap
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.api import Changes, Fetched, NeedChunks, NeedWork, Piece, Stat, fs_error, no_xattr
from casfs.vfs.chunks import chunk_spans
from casfs.vfs.overlay.nodes import Node
from casfs.vfs.overlay.writeback import RwVolume, now_ns

XATTR_CREATE = 1
XATTR_REPLACE = 2
_XATTR_NAMESPACES = (b"user.", b"trusted.", b"security.")
R = TypeVar("R")


class Data(RwVolume):
    # Base content id -> its data chunks (for st_blocks), shared by every inode of it.
    _allocated: dict[BlobId, list[ChunkNo]]

    def _load(self) -> None:
        self._allocated = {}
        super()._load()

    # -- reading -----------------------------------------------------------------

    def getattr(self, ino: InodeNo) -> Stat:
        return self._stat(self.node(ino))

    def _stat(self, node: Node) -> Stat:
        return Stat.of(node.attrs, self._blocks(node) if node.is_file else None)

    def _blocks(self, node: Node) -> int:
        """512-byte blocks a file occupies, counted by chunk: a chunk holding data counts
        (up to the end of the file), a hole none. So `du` of a sparse file stays small
        and `cp` out of the mount keeps it sparse. Cost: the base's data chunks are
        listed once per content id; then O(changed chunks) per call."""
        cs = self.chunk_size
        count = chunkmap.n_chunks(node.attrs.size, cs)
        limit = min(node.base_limit, count)
        base = self._base_allocation(node)
        chunks = bisect.bisect_left(base, limit)
        for n in self.chunk_ids.get(node.ino, ()):
            if n < count:
                chunks += self._holds_data(node, n) - (n < limit and _contains(base, n))
        used = chunks * cs
        if count and self._holds_data(node, ChunkNo(count - 1)):
            used -= count * cs - node.attrs.size  # the last chunk ends at the end of the file
        return (used + 511) // 512

    def _holds_data(self, node: Node, n: ChunkNo) -> bool:
        return self._chunk_ref(node, n) != ZERO_ID

    def _base_allocation(self, node: Node) -> list[ChunkNo]:
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
                found = [ChunkNo(0)] if content.chunk(ChunkNo(0)) != ZERO_ID else []
            if len(self._allocated) > 4096:
                self._allocated.clear()
            self._allocated[node.base] = found
        return found

    def _base_chunk(self, node: Node, n: ChunkNo) -> BlobId:
        if node.base == ZERO_ID or n >= node.base_limit:
            return ZERO_ID
        return self._content(node).chunk(n)

    def _chunk_ref(self, node: Node, n: ChunkNo) -> BlobId:
        flushed = self.chunk_ids.get(node.ino)
        if flushed is not None and n in flushed:
            return flushed[n]
        return self._base_chunk(node, n)

    def read_plan(self, ino: InodeNo, offset: int, size: int) -> list[Piece]:
        node = self.node(ino)
        if not node.is_file:
            raise fs_error(errno.EISDIR if node.is_dir else errno.EINVAL)
        pieces = []
        for n, start, stop in chunk_spans(offset, min(offset + size, node.attrs.size), self.chunk_size):
            pieces.append(Piece(start, stop, blob=self._chunk_ref(node, n)))
        return pieces

    def getxattr(self, ino: InodeNo, name: bytes) -> bytes:
        value = self.node(ino).xattrs.get(name)
        if value is None:
            raise no_xattr(name)
        return value

    def listxattr(self, ino: InodeNo) -> list[bytes]:
        return sorted(self.node(ino).xattrs)

    # -- attributes ------------------------------------------------------------------

    def setattr(self, ino: InodeNo, *, fetched: Fetched | None = None, **changes: Unpack[Changes]) -> Stat:
        mode, uid, gid = changes.get("mode"), changes.get("uid"), changes.get("gid")
        size, atime_ns, mtime_ns = changes.get("size"), changes.get("atime_ns"), changes.get("mtime_ns")
        node = self.node(ino)
        if size is not None and size != node.attrs.size:
            self._resize(node, size, fetched or {})
        now = now_ns()
        self._touch(ino)
        a = node.attrs
        new_mode = a.mode if mode is None else stat.S_IFMT(a.mode) | stat.S_IMODE(mode)
        if not node.is_dir and (uid not in (None, a.uid) or gid not in (None, a.gid)):
            # chown clears setuid, and setgid where it means set-group-id (group exec set).
            new_mode &= ~stat.S_ISUID
            if new_mode & stat.S_IXGRP:
                new_mode &= ~stat.S_ISGID
        node.set(
            mode=new_mode,
            uid=a.uid if uid is None else uid,
            gid=a.gid if gid is None else gid,
            atime_ns=a.atime_ns if atime_ns is None else atime_ns,
            mtime_ns=mtime_ns if mtime_ns is not None else now if size is not None else a.mtime_ns,
            ctime_ns=now,
        )
        return self._stat(node)

    @abstractmethod
    def _resize(self, node: Node, size: int, fetched: Fetched) -> None:
        """Cut or extend a file's data, or refuse a size change the kind does not allow
        (before anything changed)."""

    @abstractmethod
    def write(self, ino: InodeNo, offset: int, data: bytes, fetched: Fetched | None = None) -> int:
        """Write data (each kind its own way: NeedChunks, NeedWork as RwView says)."""

    def setxattr(self, ino: InodeNo, name: bytes, value: bytes, flags: int = 0) -> None:
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
        node.set(ctime_ns=now_ns())

    def removexattr(self, ino: InodeNo, name: bytes) -> None:
        node = self.node(ino)
        if name not in node.xattrs:
            raise fs_error(errno.ENODATA)
        self._touch(ino)
        del node.xattrs[name]
        node.set(ctime_ns=now_ns())

    # -- writing data ------------------------------------------------------------------

    def _within_size(self, node: Node, offset: int, data: bytes) -> bytes:
        """What of a write the kind takes (a file grows; a disk does not)."""
        return data

    def write_sync(self, ino: InodeNo, offset: int, data: bytes) -> int:
        """write(), fetching needed chunks and doing needed work in this thread (tests,
        offline tools)."""
        return self._retrying(lambda fetched: self.write(ino, offset, data, fetched))

    def truncate_sync(self, ino: InodeNo, size: int) -> Stat:
        return self._retrying(lambda fetched: self.setattr(ino, size=size, fetched=fetched))

    def _retrying(self, change: Callable[[Fetched], R]) -> R:
        """A change, retried in this thread after each NeedChunks or NeedWork."""
        fetched: Fetched = {}
        while True:
            try:
                return change(fetched)
            except NeedChunks as e:
                fetched.update((i, self.repo.get(i)) for i in e.ids)
            except NeedWork as e:
                e.run()
                e.apply()


def _contains(ordered: list[ChunkNo], n: ChunkNo) -> bool:
    i = bisect.bisect_left(ordered, n)
    return i < len(ordered) and ordered[i] == n
