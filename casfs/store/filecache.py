"""Whole files of immutable content kept as plain local files, for FUSE passthrough.

An image's or snapshot's regular file is assembled once from its chunks, each verified
against its id as every read is, into `STORE/cache/files/KEY`; the kernel then reads
that file itself (casfs.fuse.passthrough). KEY names the content by its chunk ids
(casfs.fuse.passthrough.content_key: the BLAKE3 of the file's read plan), so the same
bytes under the same chunking share one file, in every image, snapshot and mount.

A file enters whole and durable or not at all: written under a temporary name (locked
while its fill runs), fsync'd, then renamed (a crash leaves at most a temporary file,
which the next fill removes). The
files are read-only (0400: only root, the daemon, reads them). Past `limit` bytes the
least recently used files go (a hit touches its mtime); a file the kernel still has
open stays readable through its open file until that is closed.

What the kernel serves from here is not re-hashed on each read, as chunks are: it was
hashed chunk by chunk when it was filled, and the BLAKE3 of the whole file is kept in
its `user.casfs.blake3` xattr: `casfs fsck` re-hashes every cached file (check()) and
removes one that no longer matches. `casfs mount --no-passthrough` keeps the re-hash on
every read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import blake3

from casfs.store.ids import ZERO_ID, BlobId
from casfs.store.local import fsync_dir

DEFAULT_LIMIT_BYTES = 4 << 30
# Files up to this size are filled when first opened (the open waits for it: ~0.1 s for
# 64 MiB); larger ones in the background (casfs.store.filefill), served through the
# daemon until they are cached.
MAX_FILE_BYTES = 64 << 20
# The bound and the open-time fill's limit, in MiB, for tests (no GiBs written) and for
# a user who wants another bound.
ENV_LIMIT_MB = "CASFS_FILE_CACHE_MB"
ENV_OPEN_FILL_MB = "CASFS_FILE_CACHE_OPEN_FILL_MB"
_TMP_PREFIX = ".fill-"
DIGEST_XATTR = "user.casfs.blake3"


def cache_root(store: Path) -> Path:
    return store / "cache" / "files"


# A file's content as the fill takes it: each chunk's blob (ZERO_ID: a hole) and the
# range [start, end) of it in the file's order (a blob shorter than its range: zeros follow).
Part = tuple[BlobId, int, int]


def limits_from_env() -> tuple[int, int]:
    """(the cache's bound, the largest file filled at its open), bytes: the defaults, or
    what ENV_LIMIT_MB and ENV_OPEN_FILL_MB say."""
    limit = os.environ.get(ENV_LIMIT_MB)
    open_fill = os.environ.get(ENV_OPEN_FILL_MB)
    return (
        int(limit) << 20 if limit else DEFAULT_LIMIT_BYTES,
        int(open_fill) << 20 if open_fill else MAX_FILE_BYTES,
    )


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

    def fill(
        self,
        key: str,
        parts: Iterable[Part],
        fetch: Callable[[BlobId], bytes],
        progress: FillProgress | None = None,
    ) -> Path:
        """Write the file `parts` make (its blobs from `fetch`, which verifies them)
        under `key`, then trim the cache to its limit. Blocking: a worker thread's.
        `progress` is told where the file is being written and how far it is."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / key
        tmp = self.root / f"{_TMP_PREFIX}{key}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400)
        fcntl.flock(fd, fcntl.LOCK_EX)  # (a fill in flight: trim() leaves it alone)
        digest = blake3.blake3()
        try:
            if progress is not None:
                progress.opened(tmp)
            with os.fdopen(fd, "wb", closefd=False) as out:
                for blob, start, end in parts:
                    data = b"" if blob == ZERO_ID else fetch(blob)[start:end]
                    out.write(data)
                    digest.update(data)
                    if len(data) < end - start:  # the rest is zeros: a hole
                        out.seek(end - start - len(data), os.SEEK_CUR)
                        _hash_zeros(digest, end - start - len(data))
                    if progress is not None:
                        out.flush()
                        progress.written(out.tell())
                out.truncate()
            os.setxattr(fd, DIGEST_XATTR, digest.hexdigest().encode())
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

    def check(self) -> list[tuple[str, str]]:
        """Re-hash every cached file against its recorded digest; remove those that fail
        (the next open fills them again from verified chunks). (name, why) of each."""
        removed = []
        for path in self._files():
            try:
                want = os.getxattr(path, DIGEST_XATTR).decode()
                have = blake3.blake3(max_threads=blake3.blake3.AUTO)
                with open(path, "rb") as f:
                    while block := f.read(1 << 20):
                        have.update(block)
                why = None if have.hexdigest() == want else "its content does not match its digest"
            except FileNotFoundError:
                continue  # (trimmed meanwhile)
            except OSError as e:
                why = f"unreadable or without its digest ({e.strerror})"
            if why is not None:
                path.unlink(missing_ok=True)
                removed.append((path.name, why))
        return removed

    def usage(self) -> tuple[int, int]:
        """The cache's files and the bytes they take on disk (holes take none)."""
        files = used = 0
        for path in self._files():
            with contextlib.suppress(FileNotFoundError):
                used += path.stat().st_blocks * 512
                files += 1
        return files, used

    def _files(self) -> list[Path]:
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root) as it:
            return [Path(e.path) for e in it if not e.name.startswith(_TMP_PREFIX)]
        return []

    def trim(self, keep: Path | None = None) -> None:
        """Remove the least recently used files until the cache is within its limit
        (`keep`, just filled, last of all), and temporary files no fill holds."""
        files: list[tuple[float, int, Path]] = []
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root) as it:
            for entry in it:
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat(follow_symlinks=False)
                    if entry.name.startswith(_TMP_PREFIX):
                        _remove_if_abandoned(entry.path)
                        continue
                    files.append((st.st_mtime, st.st_blocks * 512, Path(entry.path)))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files, key=lambda f: (f[2] == keep, f[0])):
            if total <= self.limit:
                break
            path.unlink(missing_ok=True)
            total -= size


class FillProgress:
    """A fill's file while it is written, for its readers meanwhile: the bytes before
    `filled` are verified content already in the file (the fill writes in order), served
    from it (a pread) instead of from the packs. The file stays readable through its
    open descriptor after the fill renames it, or removes it when it fails."""

    def __init__(self) -> None:
        self.filled = 0
        self.served = 0  # bytes read from it
        self._fd: int | None = None
        self._readers = 0
        self._done = False
        self._lock = threading.Lock()  # (the fill's thread and the readers': no fd closed mid-read)

    def opened(self, tmp: Path) -> None:
        with self._lock:
            if not self._done:
                self._fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)

    def written(self, n: int) -> None:
        self.filled = n

    def read(self, offset: int, size: int) -> bytes | None:
        """The bytes [offset, offset + size) if the fill has written them, else None."""
        if offset + size > self.filled:
            return None
        with self._lock:
            if self._fd is None:
                return None
            data = os.pread(self._fd, size, offset)
        if len(data) != size:
            return None
        self.served += size
        return data

    def attach(self) -> None:
        with self._lock:
            self._readers += 1

    def detach(self) -> None:
        with self._lock:
            self._readers -= 1
            if self._done and not self._readers:
                self._close()

    def end(self) -> None:
        """The fill is over (done or not): the file is closed once no reader holds it."""
        with self._lock:
            self._done = True
            if not self._readers:
                self._close()

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _remove_if_abandoned(path: str) -> None:
    """Remove a fill's temporary file unless its fill still holds its lock."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return
    finally:
        os.close(fd)
    os.unlink(path)


_ZEROS = memoryview(bytes(1 << 20))


def _hash_zeros(digest: blake3.blake3, n: int) -> None:
    while n > 0:
        part = _ZEROS[: min(n, len(_ZEROS))]
        digest.update(part)
        n -= len(part)
