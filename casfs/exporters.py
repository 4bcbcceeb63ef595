"""Write images back out: as a directory, as a PAX tar, or as a raw block image.

Every blob comes through `get` (the repository's verified read), and every chunk's
length is checked against the size its map promises, so a short or wrong chunk is an
error, never a silently different file. Holes are seeked over and the size set with
ftruncate, so directory and raw exports stay sparse; tar has no portable holes, so a
tar export writes them as zeros. Sockets have no tar representation and are left out
of tar exports (as GNU tar does).
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import stat
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

import zstandard

from casfs.errors import Corruption, UsageError
from casfs.ids import ChunkNo
from casfs.snapshots.chunkmap import ChunkMap, Content
from casfs.snapshots.tree import Attrs, Entry, Tree
from casfs.store.ids import ZERO_ID, BlobId

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

Get = Callable[[BlobId], bytes]


# -- walking an image ------------------------------------------------------------


@dataclass(frozen=True)
class _Item:
    path: bytes  # relative, b"" for the root
    attrs: Attrs  # a directory's own attrs (from its tree), else the entry's
    entry: Entry | None  # None for the root
    leave: bool = False  # a directory seen again after all of its contents


def _walk(get: Get, root: BlobId, chunk_size: int) -> Iterator[_Item]:
    """Depth-first in name order: each directory, its contents, then the directory again."""
    top = _tree(get, root, chunk_size)
    yield _Item(b"", top.attrs, None)
    stack: list[tuple[bytes, Tree, Iterator[Entry]]] = [(b"", top, iter(top.entries))]
    while stack:
        prefix, t, it = stack[-1]
        e = next(it, None)
        if e is None:
            stack.pop()
            yield _Item(prefix, t.attrs, None, leave=True)
            continue
        if not e.name or e.name in (b".", b"..") or b"/" in e.name or b"\0" in e.name:
            raise Corruption(f"tree {prefix!r} holds an impossible name {e.name!r}")
        path = prefix + b"/" + e.name if prefix else e.name
        if e.is_dir:
            sub = _tree(get, e.blob, chunk_size)
            yield _Item(path, sub.attrs, e)
            stack.append((path, sub, iter(sub.entries)))
        else:
            yield _Item(path, e.attrs, e)


def _tree(get: Get, tid: BlobId, chunk_size: int) -> Tree:
    t = Tree.decode(get(tid))
    if t.chunk_size != chunk_size:
        raise Corruption(f"tree {tid.hex()} has chunk size {t.chunk_size}, the image {chunk_size}")
    return t


Piece = tuple[int, int, bytes | None]  # offset, length, bytes (None for a hole)


def _pieces(get: Get, chunk: Callable[[ChunkNo], BlobId], size: int, chunk_size: int) -> Iterator[Piece]:
    """Each chunk in order, lengths verified."""
    for off in range(0, size, chunk_size):
        cid = chunk(ChunkNo(off // chunk_size))
        want = min(chunk_size, size - off)
        if cid == ZERO_ID:
            yield off, want, None
            continue
        data = get(cid)
        if len(data) != want:
            raise Corruption(f"chunk {cid.hex()} holds {len(data)} bytes where {want} are expected")
        yield off, want, data


def _file_pieces(get: Get, e: Entry, chunk_size: int) -> Iterator[Piece]:
    content = Content(get, e.blob, e.attrs.size, chunk_size)
    return _pieces(get, content.chunk, e.attrs.size, chunk_size)


# -- directory -------------------------------------------------------------------


def export_dir(get: Get, root: BlobId, chunk_size: int, dest: Path) -> None:
    """Recreate the image at dest (absent, or an empty directory). Run as root to keep
    owners, devices and trusted.*/security.* xattrs; otherwise those are skipped
    (and mknod fails, as for tar -x)."""
    top = os.fsencode(dest)
    if os.path.lexists(top):
        if not os.path.isdir(top) or os.path.islink(top) or os.listdir(top):
            raise UsageError(f"{dest} exists and is not an empty directory")
    else:
        os.mkdir(top, 0o700)
    first_link: dict[int, bytes] = {}  # ino -> the path its first link was written at
    for item in _walk(get, root, chunk_size):
        path = top + b"/" + item.path if item.path else top
        e = item.entry
        if item.leave:
            _set_attrs(path, item.attrs)  # after its contents, which change its mtime
        elif e is None:
            continue  # the root: dest itself
        elif e.is_dir:
            os.mkdir(path, 0o700)
        elif e.attrs.nlink > 1 and e.attrs.ino in first_link:
            os.link(first_link[e.attrs.ino], path, follow_symlinks=False)
        else:
            _create(get, path, e, chunk_size)
            _set_attrs(path, e.attrs)
            if e.attrs.nlink > 1:
                first_link[e.attrs.ino] = path


def _create(get: Get, path: bytes, e: Entry, chunk_size: int) -> None:
    mode = e.attrs.mode
    if stat.S_ISREG(mode):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            for off, _, data in _file_pieces(get, e, chunk_size):
                if data is not None:  # holes are skipped: the file stays sparse
                    _pwrite_all(fd, data, off)
            os.ftruncate(fd, e.attrs.size)
        finally:
            os.close(fd)
    elif stat.S_ISLNK(mode):
        os.symlink(e.data, path)
    elif stat.S_ISFIFO(mode):
        os.mkfifo(path, 0o600)
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
        os.mknod(path, stat.S_IFMT(mode) | 0o600, e.attrs.rdev)
    else:
        raise Corruption(f"entry {path!r} has an unknown file type {mode:o}")


def _pwrite_all(fd: int, data: bytes, off: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, off)
        view, off = view[n:], off + n


def _set_attrs(path: bytes, a: Attrs) -> None:
    """Owner first (chown clears setuid and file capabilities), then xattrs, then the
    mode (set late so a read-only mode does not block xattrs), times last."""
    link = stat.S_ISLNK(a.mode)
    try:
        os.chown(path, a.uid, a.gid, follow_symlinks=False)
    except PermissionError:
        if os.geteuid() == 0:
            raise  # not the usual unprivileged export: a real failure
    for name, value in a.xattrs:
        try:
            os.setxattr(path, name, value, follow_symlinks=False)
        except OSError as e:
            # trusted.*, security.* and system.* need privileges or support the target may
            # lack, and Linux refuses user.* on symlinks; other user.* xattrs are plain
            # data and must not be lost quietly
            plain_data = name.startswith(b"user.") and not link
            if plain_data or e.errno not in (errno.EPERM, errno.EACCES, errno.ENOTSUP):
                raise
    if not link:
        os.chmod(path, stat.S_IMODE(a.mode))
    os.utime(path, ns=(a.atime_ns, a.mtime_ns), follow_symlinks=False)


# -- tar -------------------------------------------------------------------------


def export_tar(get: Get, root: BlobId, chunk_size: int, dest: Path | BinaryIO) -> None:
    """A PAX tar of the image: the root as ".", then every entry depth-first in name
    order; times to the ns, xattrs as SCHILY.xattr.*, hardlinks as hardlinks, numeric
    owners. Written as a stream, so dest may be a pipe. A path ending in .gz or .tgz
    is gzip-compressed, one ending in .zst zstd-compressed; a stream is plain tar."""
    if not isinstance(dest, Path):
        _write_tar(get, root, chunk_size, dest)
        return
    try:
        with open(dest, "wb") as f:
            if dest.name.endswith((".gz", ".tgz")):
                with gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:  # mtime 0: same image, same bytes
                    _write_tar(get, root, chunk_size, cast(BinaryIO, gz))
            elif dest.name.endswith(".zst"):
                with zstandard.ZstdCompressor().stream_writer(f, closefd=False) as zw:
                    _write_tar(get, root, chunk_size, zw)
            else:
                _write_tar(get, root, chunk_size, f)
    except BaseException:
        dest.unlink(missing_ok=True)  # no half archive left looking like a whole one
        raise


def _write_tar(get: Get, root: BlobId, chunk_size: int, out: BinaryIO) -> None:
    first_link: dict[int, str] = {}
    with tarfile.open(
        fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as tf:
        for item in _walk(get, root, chunk_size):
            e = item.entry
            if item.leave or (e is not None and stat.S_ISSOCK(e.attrs.mode)):
                continue
            name = _str(item.path) if item.path else "."
            ti = _tarinfo(name, item.attrs)
            if e is None or e.is_dir:
                ti.type = tarfile.DIRTYPE
            elif e.attrs.nlink > 1 and e.attrs.ino in first_link:
                ti.type, ti.linkname = tarfile.LNKTYPE, first_link[e.attrs.ino]
            else:
                if e.attrs.nlink > 1:
                    first_link[e.attrs.ino] = name
                if e.is_file:
                    ti.size = e.attrs.size
                    reader = io.BufferedReader(_Raw(_file_pieces(get, e, chunk_size)), chunk_size)
                    tf.addfile(ti, reader)
                    continue
                _special(ti, e)
            tf.addfile(ti)


def _tarinfo(name: str, a: Attrs) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.mode = stat.S_IMODE(a.mode)
    ti.uid, ti.gid = a.uid, a.gid
    ti.uname = ti.gname = ""
    ti.mtime = a.mtime_ns // 1_000_000_000
    # tarfile would write mtime as a float, losing ns; pax headers set here win.
    ti.pax_headers = {"mtime": _pax_time(a.mtime_ns), "atime": _pax_time(a.atime_ns)}
    for xname, value in a.xattrs:
        ti.pax_headers["SCHILY.xattr." + _str(xname)] = _str(value)
    return ti


def _special(ti: tarfile.TarInfo, e: Entry) -> None:
    mode = e.attrs.mode
    if stat.S_ISLNK(mode):
        ti.type, ti.linkname = tarfile.SYMTYPE, _str(e.data)
    elif stat.S_ISFIFO(mode):
        ti.type = tarfile.FIFOTYPE
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        ti.type = tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
        ti.devmajor, ti.devminor = os.major(e.attrs.rdev), os.minor(e.attrs.rdev)
    else:
        raise Corruption(f"entry {e.name!r} has an unknown file type {mode:o}")


def _str(raw: bytes) -> str:
    """Bytes as tarfile wants them: it turns surrogates back into the same bytes."""
    return raw.decode("utf-8", "surrogateescape")


def _pax_time(ns: int) -> str:
    sign = "-" if ns < 0 else ""
    sec, frac = divmod(abs(ns), 1_000_000_000)
    return f"{sign}{sec}.{frac:09d}"


class _Raw(io.RawIOBase):
    """A file's content as a raw stream, holes read as zeros (tarfile.addfile wants a
    file; BufferedReader around this gives the exact-length reads it expects)."""

    def __init__(self, pieces: Iterator[Piece]) -> None:
        self.pieces = pieces
        self.buf = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        b = memoryview(buffer).cast("B")
        if not self.buf:
            nxt = next(self.pieces, None)
            if nxt is None:
                return 0
            _, n, data = nxt
            self.buf = memoryview(data if data is not None else bytes(n))
        n = min(len(b), len(self.buf))
        b[:n] = self.buf[:n]
        self.buf = self.buf[n:]
        return n


# -- raw -------------------------------------------------------------------------


def export_raw(get: Get, map_root: BlobId, dest: Path) -> None:
    """Write a block image to dest (created or truncated): data chunks written, holes
    seeked over, the size set by ftruncate, so the file is sparse and byte-identical."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        if map_root != ZERO_ID:  # ZERO_ID: no map at all, an empty image
            cmap = ChunkMap(get, map_root)
            for off, _, data in _pieces(get, cmap.chunk, cmap.size, cmap.chunk_size):
                if data is not None:
                    _pwrite_all(fd, data, off)
            os.ftruncate(fd, cmap.size)
    finally:
        os.close(fd)
