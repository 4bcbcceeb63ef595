"""A read-only view of a disk: ROOT_INO is one regular file of the disk's size.

For block images and snapshots, and for block volumes mounted read-only. The adapter
refuses writes (read_only); the mode only tells `ls -l` what to expect.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Iterator, Sequence

from casfs.ids import InodeNo
from casfs.repo import Repository
from casfs.snapshots.chunkmap import ChunkMap
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.api import ROOT_INO, ReadPiece, Stat, no_xattr
from casfs.vfs.plan import plan_pieces


class OneFile:
    """What a read-only disk answers besides its bytes: ROOT_INO is its one file."""

    read_only = True
    immutable = True
    rw = None  # not a read/write volume

    def lookup(self, parent: InodeNo, name: bytes) -> Stat:
        self._check(parent)
        raise OSError(errno.ENOTDIR, "a block view is one file")

    def readdir(self, ino: InodeNo, offset: int) -> Iterator[tuple[bytes, Stat, int]]:
        self._check(ino)
        raise OSError(errno.ENOTDIR, "a block view is one file")

    def readlink(self, ino: InodeNo) -> bytes:
        self._check(ino)
        raise OSError(errno.EINVAL, "not a symlink")

    def getxattr(self, ino: InodeNo, name: bytes) -> bytes:
        self._check(ino)
        raise no_xattr(name)

    def listxattr(self, ino: InodeNo) -> list[bytes]:
        self._check(ino)
        return []

    def forget(self, ino: InodeNo) -> None:
        pass

    @staticmethod
    def _check(ino: InodeNo) -> None:
        if ino != ROOT_INO:
            raise OSError(errno.ESTALE, f"unknown inode {ino}")


class BlockView(OneFile):
    def __init__(
        self,
        repo: Repository,
        map_root: BlobId,
        mode: int = 0o444,
        uid: int = 0,
        gid: int = 0,
        mtime_ns: int = 0,
        label: str = "",
    ) -> None:
        self.map = ChunkMap(repo.get_meta, map_root) if map_root != ZERO_ID else None
        self.size = self.map.size if self.map is not None else 0
        self.chunk_size = self.map.chunk_size if self.map is not None else 1 << 16
        self.label = label
        self._stat = Stat(
            ino=ROOT_INO,
            mode=stat.S_IFREG | (mode & 0o7777),
            nlink=1,
            uid=uid,
            gid=gid,
            size=self.size,
            atime_ns=mtime_ns,
            mtime_ns=mtime_ns,
            ctime_ns=mtime_ns,
        )

    def getattr(self, ino: InodeNo) -> Stat:
        self._check(ino)
        if self._stat.blocks is None:
            self._stat = self._stat.with_(blocks=self._allocated_blocks())
        return self._stat

    def _allocated_blocks(self) -> int:
        """Counted once: the view is immutable."""
        if self.map is None:
            return 0
        return allocated_blocks(self.map.data_chunks(), self.size, self.chunk_size)

    def read_plan(self, ino: InodeNo, offset: int, size: int) -> list[ReadPiece]:
        self._check(ino)
        if self.map is None:
            return []
        return plan_pieces(self.map.chunk_run, self.size, self.chunk_size, offset, size)

    def describe(self, ino: InodeNo) -> str:
        return self.label or "/"


def allocated_blocks(chunks: Sequence[int], size: int, chunk_size: int) -> int:
    """512-byte blocks of a disk whose chunks `chunks` (ascending) hold data: holes
    allocate nothing (so `du` and `qemu-img info` show what the disk holds, not its size)."""
    used = len(chunks) * chunk_size
    if chunks and chunks[-1] == -(-size // chunk_size) - 1:
        used -= -(-size // chunk_size) * chunk_size - size  # a short last chunk
    return (used + 511) // 512
