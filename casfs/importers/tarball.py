"""Import a tar archive (plain, gzip, zstd, bzip2 or xz) from a stream, refusing hostile members.

The stream is read once, front to back, and always to its very end (trailing bytes
after the end-of-archive marker included): the caller hashes what is read to check
an expected digest. `progress` counts those raw bytes.

Policy, in the order tar -x would meet it:

* Names: a leading "./" and "." components are dropped; absolute names, ".."
  anywhere, and NUL bytes are refused.
* A later member replaces an earlier one at the same path, as tar -x does (a
  directory over a directory only updates its attributes); a member that would
  replace a directory holding entries, or be written beneath a symlink or a
  non-directory, is refused.
* Symlinks are kept verbatim, but refused when their target would leave the root,
  resolved from the link's directory through the finished tree (absolute targets
  start at the root, as a container sees them).
* Hardlinks must name a non-directory member already in the archive.
* Character and block devices are refused unless allow_devices.
* Directories implied by members but not in the archive get mode 0755, owner 0:0
  and mtime 0 (the epoch).
* Kept: mode, uid/gid (numeric; user and group names are ignored), mtime and atime
  to the nanosecond from pax headers (atime defaults to mtime), SCHILY.xattr.* xattrs.

Errors: HostileArchive names the member and why; a truncated or corrupt archive is a
UsageError saying "tar archive is truncated: ..." or "tar archive is corrupt: ...".
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import BinaryIO, cast

import zstandard

from casfs.errors import HostileArchive, UsageError
from casfs.importers import Built, Readable
from casfs.importers.treebuilder import Dir, Node, Parts, PathConflict, Piece, TreeBuilder
from casfs.refcount.ledger import Batch
from casfs.snapshots.tree import Attrs

Progress = Callable[[int], None]

_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"
_BZIP2 = b"BZh"
_XZ = b"\xfd7zXZ\x00"
_UNSUPPORTED = {b"\x04\x22\x4d\x18": "lz4"}
# The compression each magic number announces (images.py checks a name against it).
COMPRESSIONS = {_GZIP: "gzip", _ZSTD: "zstd", _BZIP2: "bzip2", _XZ: "xz"}
_XATTR = "SCHILY.xattr."
_READ = 1 << 16
_NAME_MAX = 255  # Linux limits: what could not be extracted is refused
_SYMLINK_MAX = 4095
_U32 = 1 << 32
_I64 = 1 << 63
_MAX_HOPS = 40  # symlinks followed while resolving one target, as the kernel's ELOOP limit


def import_tar(
    batch: Batch,
    stream: Readable,
    chunk_size: int,
    allow_devices: bool = False,
    progress: Progress | None = None,
) -> Built:
    b = TreeBuilder(batch, chunk_size)
    read_tar(stream, lambda tf, m: _add(b, tf, m, chunk_size, allow_devices), progress)
    check_symlinks(b)
    return b.finish()


Visit = Callable[[tarfile.TarFile, tarfile.TarInfo], None]


def read_tar(
    stream: Readable,
    visit: Visit,
    progress: Progress | None = None,
    plain_hook: Callable[[Readable], Readable] | None = None,
) -> None:
    """Read a tar archive (decompressed by its magic) to the very end of `stream`, calling
    `visit` on each member in order. `plain_hook` wraps the decompressed stream (an OCI
    layer's diff_id is the digest of those bytes); it is read to its end too. Truncated
    or corrupt input is a UsageError, whatever stage meets it."""
    src = _Source(stream, progress)
    try:
        plain = _decompressor(src)
        if plain_hook is not None:
            plain = plain_hook(plain)
        window = _Window(plain)
        # cast: tarfile (like gzip below) only ever calls read() on a stream it is given in "r|" mode
        fileobj = cast(BinaryIO, window)
        with tarfile.open(fileobj=fileobj, mode="r|", encoding="utf-8", errors="surrogateescape") as tf:
            while (m := tf.next()) is not None:
                # tarfile keeps every member it read; nothing here needs them (typeshed omits the list)
                tf.members.clear()  # type: ignore[attr-defined]
                visit(tf, m)
            _check_end(window.block_at(tf.offset), tf.offset)
        _drain(plain)
        _drain(src)
    except EOFError as e:  # gzip and zstd streams that stop mid-stream
        raise UsageError(f"tar archive is truncated: {e}") from None
    except tarfile.ReadError as e:
        raise _read_error(str(e)) from None
    except (tarfile.TarError, zlib.error, gzip.BadGzipFile, zstandard.ZstdError, lzma.LZMAError) as e:
        raise UsageError(f"tar archive is corrupt: {e}") from None
    except OSError as e:
        if e.errno is not None:
            raise  # reading the source failed: not the archive's fault
        raise UsageError(f"tar archive is corrupt: {e}") from None  # (bz2: "Invalid data stream")


def _add(
    b: TreeBuilder, tf: tarfile.TarFile, m: tarfile.TarInfo, chunk_size: int, allow_devices: bool
) -> None:
    parts = member_path(m.name, m.name)
    try:
        add_member(b, tf, m, parts, chunk_size, allow_devices)
    except PathConflict as e:
        raise HostileArchive(f"tar member {m.name!r} refused: {e}") from None


def add_member(
    b: TreeBuilder,
    tf: tarfile.TarFile,
    m: tarfile.TarInfo,
    parts: Parts,
    chunk_size: int,
    allow_devices: bool,
) -> Node | Dir:
    """Place one member at `parts` by the rules above (an OCI layer's entries too, once
    its whiteouts are handled). PathConflict is the caller's to word."""
    if m.isdir():
        return b.add_dir(parts, _attrs(m, stat.S_IFDIR))
    if m.isreg():
        f = tf.extractfile(m)
        assert f is not None  # a regular member always has a file object
        return b.add_file(parts, _attrs(m, stat.S_IFREG), _pieces(f, m.size, chunk_size))
    if m.issym():
        target = m.linkname.encode("utf-8", "surrogateescape")
        if not target or b"\0" in target or len(target) > _SYMLINK_MAX:
            raise HostileArchive(f"tar member {m.name!r} refused: invalid symlink target")
        return b.add_symlink(parts, _attrs(m, stat.S_IFLNK), target)
    if m.islnk():
        node = b.lookup(member_path(m.linkname, m.name))
        if not isinstance(node, Node):
            raise HostileArchive(
                f"tar member {m.name!r} refused: hardlink to {m.linkname!r}, which is not an earlier "
                "non-directory member"
            )
        return b.add_link(parts, node)
    if m.ischr() or m.isblk():
        if not allow_devices:
            raise HostileArchive(
                f"tar member {m.name!r} refused: device nodes are not allowed "
                "(--allow-devices keeps them, e.g. for a root filesystem's /dev)"
            )
        kind = stat.S_IFCHR if m.ischr() else stat.S_IFBLK
        return b.add_special(parts, _attrs(m, kind).with_(rdev=os.makedev(m.devmajor, m.devminor)))
    if m.isfifo():
        return b.add_special(parts, _attrs(m, stat.S_IFIFO))
    raise HostileArchive(f"tar member {m.name!r} refused: unsupported member type {m.type!r}")


def member_path(name: str, member: str) -> Parts:
    raw = name.encode("utf-8", "surrogateescape")
    why = None
    if raw.startswith(b"/"):
        why = "absolute path"
    elif b"\0" in raw:
        why = "NUL byte in a name"
    parts = tuple(p for p in raw.split(b"/") if p not in (b"", b"."))
    if b".." in parts:
        why = "'..' in a path"
    elif any(len(p) > _NAME_MAX for p in parts):
        why = f"a name longer than {_NAME_MAX} bytes"
    if why is not None:
        what = "" if name == member else f" (link target {name!r})"
        raise HostileArchive(f"tar member {member!r} refused: {why}{what}")
    return parts


def _attrs(m: tarfile.TarInfo, kind: int) -> Attrs:
    mtime = _ns(m.pax_headers["mtime"]) if "mtime" in m.pax_headers else int(m.mtime) * 1_000_000_000
    atime = _ns(m.pax_headers["atime"]) if "atime" in m.pax_headers else mtime
    xattrs = tuple(
        (k[len(_XATTR) :].encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape"))
        for k, v in m.pax_headers.items()
        if k.startswith(_XATTR)
    )
    if not (
        0 <= m.uid < _U32 and 0 <= m.gid < _U32 and -_I64 <= min(mtime, atime) <= max(mtime, atime) < _I64
    ):
        raise UsageError(f"tar archive is corrupt: member {m.name!r} has an owner or time out of range")
    mode = kind | stat.S_IMODE(m.mode)
    return Attrs(mode=mode, uid=m.uid, gid=m.gid, atime_ns=atime, mtime_ns=mtime, xattrs=xattrs)


def _ns(text: str) -> int:
    """A pax time ("1577836800.123456789") in ns, exactly: float would lose digits."""
    try:
        return int(Decimal(text) * 1_000_000_000)
    except (ArithmeticError, ValueError):
        raise UsageError(f"tar archive is corrupt: bad pax time {text!r}") from None


def _pieces(f: Readable, size: int, chunk_size: int) -> Iterator[Piece]:
    left = size
    while left:
        want = min(chunk_size, left)
        piece = f.read(want)
        while len(piece) < want:
            more = f.read(want - len(piece))
            if not more:
                raise EOFError("a member's data ends early")
            piece += more
        left -= want
        yield piece


def _check_end(block: bytes, offset: int) -> None:
    """tarfile stops quietly at a missing or garbled header; only a zero block is the end."""
    if block == bytes(tarfile.BLOCKSIZE):
        return
    if len(block) < tarfile.BLOCKSIZE:
        raise UsageError(f"tar archive is truncated: it ends at byte {offset}, with no end-of-archive marker")
    raise UsageError(f"tar archive is corrupt: invalid header at byte {offset}")


def _read_error(text: str) -> UsageError:
    if "unexpected end" in text or "truncated" in text:
        return UsageError(f"tar archive is truncated: {text}")
    if text == "empty file":
        return UsageError("not a tar archive: the stream is empty")
    return UsageError(f"tar archive is corrupt: {text}")


def check_symlinks(b: TreeBuilder) -> None:
    stack: list[tuple[Parts, Dir]] = [((), b.root)]
    while stack:
        parts, d = stack.pop()
        for name, c in d.entries.items():
            if isinstance(c, Dir):
                stack.append(((*parts, name), c))
            elif stat.S_ISLNK(c.attrs.mode) and (_climbs(parts, c.data) or _resolves_out(b, parts, c.data)):
                path = b"/".join((*parts, name)).decode("utf-8", "surrogateescape")
                target = c.data.decode("utf-8", "surrogateescape")
                raise HostileArchive(f"tar member {path!r} refused: symlink to {target!r} leaves the root")


def _climbs(where: Parts, target: bytes) -> bool:
    """Lexically, does target climb above the root from directory `where`?"""
    depth = 0 if target.startswith(b"/") else len(where)
    for p in target.split(b"/"):
        if p == b"..":
            depth -= 1
            if depth < 0:
                return True
        elif p not in (b"", b"."):
            depth += 1
    return False


def _resolves_out(b: TreeBuilder, where: Parts, target: bytes) -> bool:
    """Following symlinks in the finished tree, does target lead above the root?"""
    cur = [] if target.startswith(b"/") else list(where)
    todo = target.split(b"/")[::-1]
    hops = 0
    while todo:
        name = todo.pop()
        if name in (b"", b"."):
            continue
        if name == b"..":
            if not cur:
                return True
            cur.pop()
            continue
        cur.append(name)
        node = b.lookup(tuple(cur))
        if isinstance(node, Node) and stat.S_ISLNK(node.attrs.mode):
            hops += 1
            if hops > _MAX_HOPS:
                return False  # ELOOP: leads nowhere
            cur.pop()
            if node.data.startswith(b"/"):
                cur = []
            todo += node.data.split(b"/")[::-1]
    return False


# -- streams -------------------------------------------------------------------


class _Source:
    """The caller's stream: counts progress and lets the magic be peeked at."""

    def __init__(self, stream: Readable, progress: Progress | None) -> None:
        self.stream = stream
        self.progress = progress
        self.head = b""

    def peek(self, n: int) -> bytes:
        while len(self.head) < n:
            more = self._read(n - len(self.head))
            if not more:
                break
            self.head += more
        return self.head[:n]

    def read(self, n: int, /) -> bytes:
        if self.head:
            out, self.head = self.head[:n], self.head[n:]
            return out
        return self._read(n)

    def _read(self, n: int) -> bytes:
        data = self.stream.read(n)
        if data and self.progress is not None:
            self.progress(len(data))
        return data


def _decompressor(src: _Source) -> Readable:
    magic = src.peek(6)
    if magic.startswith(_GZIP):
        return gzip.GzipFile(fileobj=cast(BinaryIO, src), mode="rb")
    if magic.startswith(_ZSTD):
        return _Zstd(src)
    if magic.startswith(_BZIP2):
        return bz2.BZ2File(cast(BinaryIO, src), mode="rb")
    if magic.startswith(_XZ):
        return lzma.LZMAFile(cast(BinaryIO, src), mode="rb")
    for prefix, name in _UNSUPPORTED.items():
        if magic.startswith(prefix):
            raise UsageError(
                f"{name}-compressed tar archives are not supported (use plain, gzip, zstd, bzip2 or xz)"
            )
    return src


class _Zstd:
    """zstd frames back to back. Not stream_reader: that ends quietly when the input
    stops mid-frame, and a truncated archive must be an error. Input is fed 1 KiB at
    a time because a zstd bomb expands 1 KiB into at most ~32 MiB."""

    FEED = 1024

    def __init__(self, src: Readable) -> None:
        self.src = src
        self.dctx = zstandard.ZstdDecompressor()
        self.obj: zstandard.ZstdDecompressionObj | None = None
        self.inp = memoryview(b"")
        self.out = memoryview(b"")

    def read(self, n: int, /) -> bytes:
        while not self.out:
            if not self.inp:
                self.inp = memoryview(self.src.read(_READ))
                if not self.inp:
                    if self.obj is not None and not self.obj.eof:
                        raise EOFError("zstd stream ends inside a frame")
                    return b""
            if self.obj is None or self.obj.eof:
                self.obj = self.dctx.decompressobj()
            feed, self.inp = self.inp[: self.FEED], self.inp[self.FEED :]
            self.out = memoryview(self.obj.decompress(feed))
            if self.obj.eof and self.obj.unused_data:  # the next frame starts here
                self.inp = memoryview(self.obj.unused_data + bytes(self.inp))
        out, self.out = self.out[:n], self.out[n:]
        return bytes(out)


class _Window:
    """Reads through, keeping the last bytes read, so that the block where tarfile
    stopped can be checked to be a real end-of-archive marker."""

    KEEP = 1 << 16  # more than tarfile reads ahead (its 10 KiB record)

    def __init__(self, src: Readable) -> None:
        self.src = src
        self.buf = bytearray()
        self.base = 0  # stream offset of buf[0]

    def read(self, n: int, /) -> bytes:
        data = self.src.read(n)
        self.buf += data
        if len(self.buf) > 2 * self.KEEP:
            drop = len(self.buf) - self.KEEP
            del self.buf[:drop]
            self.base += drop
        return data

    def block_at(self, offset: int) -> bytes:
        i = offset - self.base
        assert i >= 0, "tarfile read further ahead than the window keeps"
        return bytes(self.buf[i : i + tarfile.BLOCKSIZE])


def _drain(f: Readable) -> None:
    while f.read(_READ):
        pass
