"""Whole files of immutable content kept as plain local files, for FUSE passthrough.

An image's or snapshot's regular file is assembled once from its chunks, each verified
against its id as every read is, into `STORE/cache/files/KEY`; the kernel then reads
that file itself (casfs.fuse.passthrough). KEY names the content by its chunk ids: the
BLAKE3 of the file's read plan (size, and each chunk's id and range), so the same bytes
under the same chunking share one file, in every image, snapshot and mount of the store.

A file enters whole and durable or not at all: written under a temporary name, fsync'd,
then renamed (a crash leaves at most a temporary file, removed by the next fill). The
files are read-only (0400: only root, the daemon, reads them). Past `limit` bytes the
least recently used files go (a hit touches its mtime); a file the kernel still has
open stays readable through its open file until that is closed.

What the kernel serves from here is not re-hashed on each read, as chunks are: it was
hashed chunk by chunk when it was filled. `casfs mount --no-passthrough` keeps the
re-hash on every read.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import blake3

from casfs.lifecycle.pids import alive
from casfs.store.ids import ZERO_ID, BlobId
from casfs.store.local import fsync_dir
from casfs.vfs.api import Piece, assemble

DEFAULT_LIMIT_BYTES = 4 << 30
# Files up to this size are filled when first opened (the open waits for it: ~0.1 s for
# 64 MiB); larger ones are served through the daemon as before.
MAX_FILE_BYTES = 64 << 20
_TMP_PREFIX = ".fill-"


def content_key(size: int, pieces: list[Piece]) -> str | None:
    """The key of a file whose read plan is `pieces`, or None when its bytes are not all
    in blobs (a read/write volume's upper file, bytes in memory)."""
    h = blake3.blake3(size.to_bytes(8, "little"))
    for p in pieces:
        if p.data is not None or p.read is not None:
            return None
        h.update(p.blob)
        h.update(p.start.to_bytes(4, "little") + p.end.to_bytes(4, "little"))
    return h.hexdigest()


class FileCache:
    def __init__(self, root: Path, limit: int = DEFAULT_LIMIT_BYTES) -> None:
        self.root = root
        self.limit = limit

    def lookup(self, key: str) -> Path | None:
        """The cached file of `key`, marked as just used, or None."""
        path = self.root / key
        try:
            os.utime(path)
        except FileNotFoundError:
            return None
        return path

    def fill(self, key: str, pieces: list[Piece], fetch: Callable[[BlobId], bytes]) -> Path:
        """Write the file `pieces` describe (its blobs from `fetch`, which verifies them)
        under `key`, then trim the cache to its limit. Blocking: a worker thread's."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / key
        tmp = self.root / f"{_TMP_PREFIX}{key}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o400)
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                for p in pieces:
                    if p.blob == ZERO_ID:  # a hole stays one
                        out.seek(p.end - p.start, os.SEEK_CUR)
                    else:
                        out.write(assemble([p], fetch))
                out.truncate()
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(tmp, path)
        fsync_dir(self.root)
        self.trim(keep=path)
        return path

    def trim(self, keep: Path | None = None) -> None:
        """Remove the least recently used files until the cache is within its limit
        (`keep`, just filled, last of all), and temporary files of dead fills."""
        files: list[tuple[float, int, Path]] = []
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root) as it:
            for entry in it:
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat(follow_symlinks=False)
                    if entry.name.startswith(_TMP_PREFIX):
                        pid = entry.name.rsplit(".", 1)[-1]
                        if not (pid.isdigit() and alive(int(pid))):
                            os.unlink(entry.path)
                        continue
                    files.append((st.st_mtime, st.st_blocks * 512, Path(entry.path)))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files, key=lambda f: (f[2] == keep, f[0])):
            if total <= self.limit:
                break
            path.unlink(missing_ok=True)
            total -= size
