"""Directory trees: one blob per directory, entries sorted by name.

  "CTRE" v1 | chunk_size u32 | self attrs | count u32 | entries
  entry:  name_len u16 | name | attrs | data_len u16 | data
  attrs:  mode u32 uid u32 gid u32 rdev u64 size u64 atime mtime ctime (ns, i64)
          ino u64 nlink u32 | xattr count u16 | (name_len u16 name value_len u32 value)*

A directory's own attributes live in its own blob (`attrs`), so the root directory
has a home; its entry in the parent carries only name, type bits of the mode, ino and
the subtree id. `data` is, by type: regular file - content id (a chunk id, a chunk-map
root, or ZERO_ID; see chunkmap.Content), directory - subtree id, symlink - the
target's bytes, anything else - empty. Hardlinks are entries sharing an ino.
chunk_size is the one of the image or volume, so that children() can tell a file's
direct chunk from its chunk map.
"""

from __future__ import annotations

import contextlib
import stat
import struct
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, TypedDict, TypeVar, Unpack

from casfs.errors import Corruption
from casfs.ids import NO_INO, InodeNo
from casfs.kinds import BlobKind
from casfs.snapshots.chunkmap import content_kind
from casfs.store.ids import ZERO_ID, BlobId

_HEAD = struct.Struct("<4sBI")
_ATTRS = struct.Struct("<IIIQQqqqQIH")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_XNAME = struct.Struct("<H")
_XVAL = struct.Struct("<I")
_MAGIC = b"CTRE"
_VERSION = 1

XAttrs = tuple[tuple[bytes, bytes], ...]


class AttrChanges(TypedDict, total=False):
    """What Attrs.with_ may change (a name left out stays as it is)."""

    mode: int
    uid: int
    gid: int
    rdev: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    ino: InodeNo
    nlink: int
    xattrs: XAttrs


@dataclass(frozen=True, slots=True)
class Attrs:
    # Slots: a mount keeps one for every entry of the trees it has decoded and every
    # inode the kernel holds (a __dict__ made each about 100 bytes bigger).
    mode: int
    uid: int = 0
    gid: int = 0
    rdev: int = 0
    size: int = 0
    atime_ns: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    ino: InodeNo = NO_INO
    nlink: int = 1
    xattrs: XAttrs = ()

    def with_(self, **changes: Unpack[AttrChanges]) -> Attrs:
        return copy_with(self, changes)


A = TypeVar("A", bound=Attrs)
_FIELDS: dict[type, tuple[tuple[str, ...], frozenset[str], attrgetter[Any]]] = {}


def _fields(cls: type) -> tuple[tuple[str, ...], frozenset[str], attrgetter[Any]]:
    """A class's field names, as a set too, and a getter of all their values at once."""
    found = _FIELDS.get(cls)
    if found is None:
        names = tuple(f.name for f in fields(cls))
        found = _FIELDS[cls] = (names, frozenset(names), attrgetter(*names))
    return found


def copy_with(attrs: A, changes: Mapping[str, object]) -> A:
    """`attrs` with some fields changed: dataclasses.replace without its walk over the
    fields and its __init__, as the fields have no checks (a mounted volume's requests
    make several of these each: replace cost about 15 µs, this 1-2)."""
    cls = type(attrs)
    names, known, values = _fields(cls)
    assert changes.keys() <= known, changes
    new = object.__new__(cls)
    for name, value in zip(names, values(attrs), strict=True):
        object.__setattr__(new, name, value)
    for name, value in changes.items():
        object.__setattr__(new, name, value)
    return new


def extend(attrs: Attrs, cls: type[A], **more: Any) -> A:
    """`attrs` as an instance of a subclass, its extra fields given (as cheaply)."""
    return cls(*_fields(type(attrs))[2](attrs), **more)


class Typed:
    """The file type of anything that carries `attrs` (an entry here, an overlay node)."""

    __slots__ = ()  # (so that a subclass with slots has no __dict__)
    attrs: Attrs

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.attrs.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.attrs.mode)

    @property
    def is_symlink(self) -> bool:
        return stat.S_ISLNK(self.attrs.mode)


@dataclass(frozen=True, slots=True)
class Entry(Typed):
    name: bytes
    attrs: Attrs
    data: bytes = b""

    @property
    def blob(self) -> BlobId:
        """The subtree or content id (ZERO_ID when there is none)."""
        if self.is_dir or self.is_file:
            return BlobId(self.data) if self.data else ZERO_ID
        return ZERO_ID


@dataclass
class Tree:
    attrs: Attrs
    chunk_size: int
    entries: list[Entry] = field(default_factory=list)

    def encode(self) -> bytes:
        self.entries.sort(key=lambda e: e.name)
        parts = [
            _HEAD.pack(_MAGIC, _VERSION, self.chunk_size),
            _pack_attrs(self.attrs),
            _U32.pack(len(self.entries)),
        ]
        for e in self.entries:
            parts += [_U16.pack(len(e.name)), e.name, _pack_attrs(e.attrs), _U16.pack(len(e.data)), e.data]
        return b"".join(parts)

    def children(self) -> Iterator[tuple[BlobId, BlobKind]]:
        """(child id, child kind) for every blob the tree names, holes left out."""
        for e in self.entries:
            if e.is_dir:
                yield BlobId(e.data), BlobKind.TREE
            elif e.is_file and e.data and e.data != ZERO_ID:
                yield BlobId(e.data), content_kind(e.attrs.size, self.chunk_size)

    @staticmethod
    def decode(plain: bytes) -> Tree:
        with _parsing():
            attrs, chunk_size, count, pos = _head(plain)
            entries = []
            for _ in range(count):
                name, eattrs, data, pos = _fields_at(plain, pos, Attrs)
                entries.append(Entry(name, eattrs, data))
            _check_end(plain, pos)
        return Tree(attrs, chunk_size, entries)

    def find(self, name: bytes) -> Entry | None:
        lo, hi = 0, len(self.entries)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entries[mid].name < name:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.entries) and self.entries[lo].name == name:
            return self.entries[lo]
        return None


class TreeIndex:
    """A tree blob kept as its bytes, each entry decoded when it is asked for: what a
    daemon serving an immutable tree keeps of it. The whole blob is checked once, when
    it is indexed, so entry() cannot meet a malformed one. A decoded Tree takes about four
    times its blob's size (an Attrs, an Entry and eleven ints per entry), and a daemon
    that served `ls -lR` of /usr/share (58,000 entries) held 28 MiB of them."""

    __slots__ = ("_offsets", "attrs", "chunk_size", "plain", "subdirs")

    def __init__(self, plain: bytes) -> None:
        self.plain = plain
        offsets = array("I")
        subdirs = 0
        with _parsing():
            self.attrs, self.chunk_size, count, pos = _head(plain)
            for _ in range(count):
                offsets.append(pos)
                _, attrs, _, pos = _fields_at(plain, pos, Attrs)
                subdirs += stat.S_ISDIR(attrs.mode)
            _check_end(plain, pos)
        self.subdirs = subdirs  # (a directory's link count is 2 + this)
        self._offsets = offsets

    def __len__(self) -> int:
        return len(self._offsets)

    def entry(self, i: int) -> Entry:
        name, attrs, data, _ = _fields_at(self.plain, self._offsets[i], Attrs)
        return Entry(name, attrs, data)

    def fields(self, i: int, attrs_type: type[A]) -> tuple[bytes, A, bytes]:
        """Entry i's name, attributes and data, the attributes made as `attrs_type` (a
        subclass of Attrs with defaults for its own fields: a view's Stat, no copy)."""
        name, attrs, data, _ = _fields_at(self.plain, self._offsets[i], attrs_type)
        return name, attrs, data

    def name(self, i: int) -> bytes:
        pos = self._offsets[i]
        (n,) = _U16.unpack_from(self.plain, pos)
        return self.plain[pos + 2 : pos + 2 + n]

    def index_of(self, name: bytes) -> int | None:
        """The position of the entry called `name` (entries are sorted by name)."""
        lo, hi = 0, len(self._offsets)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.name(mid) < name:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < len(self._offsets) and self.name(lo) == name else None


@contextlib.contextmanager
def _parsing() -> Iterator[None]:
    try:
        yield
    except struct.error as e:
        raise Corruption(f"tree blob is truncated: {e}") from None


def _head(plain: bytes) -> tuple[Attrs, int, int, int]:
    """A tree blob's own attributes, chunk size, entry count and where entries start."""
    magic, version, chunk_size = _HEAD.unpack_from(plain)
    if magic != _MAGIC or version != _VERSION:
        raise Corruption("not a tree blob")
    attrs, pos = _unpack_attrs(plain, _HEAD.size, Attrs)
    (count,) = _U32.unpack_from(plain, pos)
    return attrs, chunk_size, count, pos + 4


def _fields_at(plain: bytes, pos: int, attrs_type: type[A]) -> tuple[bytes, A, bytes, int]:
    """The entry at `pos`: name, attributes, data, and where the next one starts."""
    (n,) = _U16.unpack_from(plain, pos)
    name = plain[pos + 2 : pos + 2 + n]
    pos += 2 + n
    attrs, pos = _unpack_attrs(plain, pos, attrs_type)
    (dn,) = _U16.unpack_from(plain, pos)
    data = plain[pos + 2 : pos + 2 + dn]
    return name, attrs, data, pos + 2 + dn


def _check_end(plain: bytes, pos: int) -> None:
    if pos != len(plain):
        raise Corruption("tree blob has trailing bytes")


def dir_entry(name: bytes, mode: int, ino: InodeNo, subtree: BlobId) -> Entry:
    """A directory's entry in its parent: type bits, ino and subtree only."""
    return Entry(name, Attrs(mode=stat.S_IFDIR | stat.S_IMODE(mode), ino=ino, nlink=0), subtree)


def children(plain: bytes) -> Iterator[tuple[BlobId, BlobKind]]:
    return Tree.decode(plain).children()


def _pack_attrs(a: Attrs) -> bytes:
    parts = [
        _ATTRS.pack(
            a.mode,
            a.uid,
            a.gid,
            a.rdev,
            a.size,
            a.atime_ns,
            a.mtime_ns,
            a.ctime_ns,
            a.ino,
            a.nlink,
            len(a.xattrs),
        )
    ]
    for name, value in a.xattrs:
        parts += [_XNAME.pack(len(name)), name, _XVAL.pack(len(value)), value]
    return b"".join(parts)


def _unpack_attrs(plain: bytes, pos: int, attrs_type: type[A]) -> tuple[A, int]:
    mode, uid, gid, rdev, size, at, mt, ct, ino, nlink, nx = _ATTRS.unpack_from(plain, pos)
    pos += _ATTRS.size
    xattrs = []
    for _ in range(nx):
        (n,) = _XNAME.unpack_from(plain, pos)
        name = plain[pos + 2 : pos + 2 + n]
        pos += 2 + n
        (v,) = _XVAL.unpack_from(plain, pos)
        value = plain[pos + 4 : pos + 4 + v]
        if len(value) != v:
            raise Corruption("tree blob is truncated in an xattr")
        pos += 4 + v
        xattrs.append((name, value))
    return attrs_type(mode, uid, gid, rdev, size, at, mt, ct, ino, nlink, tuple(xattrs)), pos
