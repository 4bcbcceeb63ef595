"""The inodes of a read/write volume, in memory and as overlay rows."""

from __future__ import annotations

import bisect
import dataclasses
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Unpack

from casfs.ids import NO_INO, InodeNo
from casfs.snapshots.tree import AttrChanges, Attrs, Entry, Tree, Typed
from casfs.store.ids import ZERO_ID, BlobId
from casfs.vfs.api import Stat

_XHEAD = struct.Struct("<HI")

# No chunk limit: a file that was never truncated reads every base chunk.
NO_LIMIT = 1 << 62


@dataclass
class Listing:
    """A directory's entries with stable readdir cookies: an entry keeps its cookie
    while others come and go, so a reader that resumes at a cookie skips nothing."""

    entries: dict[bytes, tuple[int, InodeNo]] = field(default_factory=dict)  # name -> (cookie, ino)
    next_cookie: int = 1
    # What the catalog lacks (overlay_entries rows): every entry (`whole`, a listing just
    # copied up), or the names added, removed or re-pointed since the last flush.
    whole: bool = field(default=True, compare=False)
    changed: set[bytes] = field(default_factory=set, compare=False)
    # (next_cookie, len(entries)) -> (cookie, name) in cookie order: see after()
    _order: tuple[tuple[int, int], list[tuple[int, bytes]]] | None = field(
        default=None, compare=False, repr=False
    )

    def add(self, name: bytes, ino: InodeNo) -> None:
        self.entries[name] = (self.next_cookie, ino)
        self.next_cookie += 1
        self.changed.add(name)

    def remove(self, name: bytes) -> None:
        del self.entries[name]
        self.changed.add(name)

    def copy(self) -> Listing:
        return Listing(dict(self.entries), self.next_cookie)

    def ino(self, name: bytes) -> InodeNo | None:
        item = self.entries.get(name)
        return item[1] if item else None

    def after(self, offset: int) -> Iterator[tuple[int, bytes, InodeNo]]:
        """(cookie, name, ino) of the entries whose cookie is above `offset`, in cookie
        order. The order is cached between readdir calls (a big directory is read in
        many): add() always takes a new, higher cookie and a removal shrinks the dict,
        so (next_cookie, len) names the set of (cookie, name) pairs; replace() keeps it."""
        key = (self.next_cookie, len(self.entries))
        if self._order is None or self._order[0] != key:
            self._order = (key, sorted((c, name) for name, (c, _) in self.entries.items()))
        order = self._order[1]
        for i in range(bisect.bisect_right(order, offset, key=itemgetter(0)), len(order)):
            cookie, name = order[i]
            yield cookie, name, self.entries[name][1]

    def replace(self, name: bytes, ino: InodeNo) -> None:
        cookie, _ = self.entries[name]
        self.entries[name] = (cookie, ino)
        self.changed.add(name)

    def pending(self) -> tuple[bool, list[tuple[bytes, int, InodeNo]], list[bytes]]:
        """What a flush writes: (whole, (name, cookie, ino) to store, names to delete)."""
        if self.whole:
            return True, [(n, c, i) for n, (c, i) in self.entries.items()], []
        present = [(n, *self.entries[n]) for n in self.changed if n in self.entries]
        return False, present, [n for n in self.changed if n not in self.entries]

    def committed(self) -> None:
        self.whole = False
        self.changed.clear()

    def header(self) -> bytes:
        """The overlay row's `listing` column: the next cookie (entries have rows)."""
        return struct.pack("<Q", self.next_cookie)

    @staticmethod
    def from_header(raw: bytes, entries: dict[bytes, tuple[int, InodeNo]]) -> Listing:
        (next_cookie,) = struct.unpack_from("<Q", raw)
        listing = Listing(entries, max(next_cookie, max((c for c, _ in entries.values()), default=0) + 1))
        listing.whole = False
        return listing


@dataclass
class Node(Typed):
    """An inode of a read/write volume, in memory. Its attributes are the tree's record
    (Attrs, replaced on change: `set`), but for the extended ones, which a mutable dict
    holds until a fold or a flush encodes them."""

    attrs: Attrs  # (its xattrs stay empty: see `xattrs`)
    xattrs: dict[bytes, bytes] = field(default_factory=dict)
    base: BlobId = ZERO_ID  # file: base content id; dir: base subtree id
    base_limit: int = NO_LIMIT
    target: bytes = b""
    parent: InodeNo = NO_INO
    listing: Listing | None = None  # directories whose entries changed
    upper: int | None = None  # a directory volume's file: the generation of its upper file

    @property
    def ino(self) -> InodeNo:
        return self.attrs.ino

    def set(self, **changes: Unpack[AttrChanges]) -> None:
        self.attrs = self.attrs.with_(**changes)

    def stat(self) -> Stat:
        return Stat.of(self.attrs)

    def tree_attrs(self) -> Attrs:
        """The attributes as a tree entry stores them (extended ones included)."""
        return self.attrs.with_(xattrs=tuple(sorted(self.xattrs.items())))

    def row(self, volume: str) -> tuple[object, ...]:
        a = self.attrs
        return (
            volume, a.ino, a.mode, a.uid, a.gid, a.rdev, a.size, a.atime_ns, a.mtime_ns, a.ctime_ns, a.nlink,
            encode_xattrs(self.xattrs),
            self.base,
            min(self.base_limit, NO_LIMIT),
            self.target,
            self.parent,
            self.listing.header() if self.listing is not None else None,
            self.upper,
        )  # fmt: skip

    @staticmethod
    def from_row(row: tuple[Any, ...], entries: dict[bytes, tuple[int, InodeNo]] | None = None) -> Node:
        """A node from its overlay row; a directory's `entries` come from overlay_entries."""
        (
            _,
            ino,
            mode,
            uid,
            gid,
            rdev,
            size,
            at,
            mt,
            ct,
            nlink,
            xattrs,
            base,
            limit,
            target,
            parent,
            lst,
            up,
        ) = row
        listing = Listing.from_header(lst, entries or {}) if lst is not None else None
        attrs = Attrs(mode, uid, gid, rdev, size, at, mt, ct, InodeNo(ino), nlink)
        return Node(attrs, decode_xattrs(xattrs), BlobId(base), limit, target, InodeNo(parent), listing, up)

    def copy(self) -> Node:
        """A copy the fold can read while this one changes (listing and xattrs too)."""
        return dataclasses.replace(
            self, xattrs=dict(self.xattrs), listing=self.listing.copy() if self.listing is not None else None
        )

    @staticmethod
    def from_entry(entry: Entry, parent: InodeNo) -> Node:
        """A base entry copied up (a directory's own attrs come from its tree)."""
        a = entry.attrs
        target = entry.data if entry.is_symlink else b""
        return Node(a.with_(xattrs=()), dict(a.xattrs), entry.blob, NO_LIMIT, target, parent)

    @staticmethod
    def from_tree(tree: Tree, subtree: BlobId, parent: InodeNo) -> Node:
        a = tree.attrs
        subdirs = sum(1 for e in tree.entries if e.is_dir)
        attrs = a.with_(size=0, nlink=2 + subdirs, xattrs=())
        return Node(attrs, dict(a.xattrs), subtree, NO_LIMIT, b"", parent)


def encode_xattrs(x: dict[bytes, bytes]) -> bytes:
    parts = []
    for name, value in sorted(x.items()):
        parts += [_XHEAD.pack(len(name), len(value)), name, value]
    return b"".join(parts)


def decode_xattrs(raw: bytes) -> dict[bytes, bytes]:
    out = {}
    pos = 0
    while pos < len(raw):
        n, v = _XHEAD.unpack_from(raw, pos)
        pos += _XHEAD.size
        out[raw[pos : pos + n]] = raw[pos + n : pos + n + v]
        pos += n + v
    return out
