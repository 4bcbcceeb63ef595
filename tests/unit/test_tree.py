"""Tree blobs: a decoded Tree and a TreeIndex read the same blob alike, and both refuse a
malformed one with Corruption (EIO at a mount), never with wrong entries."""

from __future__ import annotations

import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from casfs.errors import Corruption
from casfs.ids import InodeNo
from casfs.snapshots.tree import Attrs, Entry, Tree, TreeIndex, dir_entry
from casfs.store.ids import BlobId
from casfs.vfs.api import Stat

SUBTREE = BlobId(b"\x07" * 32)


def sample() -> Tree:
    own = Attrs(mode=stat.S_IFDIR | 0o750, uid=5, gid=6, mtime_ns=1_700_000_000_123_456_789, ino=InodeNo(1))
    entries = [
        Entry(b"file", Attrs(mode=stat.S_IFREG | 0o644, size=12, ino=InodeNo(2), nlink=2), b"\x01" * 32),
        Entry(b"hardlink", Attrs(mode=stat.S_IFREG | 0o644, size=12, ino=InodeNo(2), nlink=2), b"\x01" * 32),
        dir_entry(b"sub", 0o755, InodeNo(3), SUBTREE),
        Entry(b"link", Attrs(mode=stat.S_IFLNK | 0o777, ino=InodeNo(4)), b"../target"),
        Entry(b"x", Attrs(mode=stat.S_IFREG | 0o600, ino=InodeNo(5), xattrs=((b"user.k", b"v" * 300),))),
    ]
    return Tree(own, 65536, entries)


def test_an_index_reads_what_decode_reads() -> None:
    plain = sample().encode()
    tree, index = Tree.decode(plain), TreeIndex(plain)
    assert tree.attrs == sample().attrs  # the directory's own, not its last entry's
    assert (index.attrs, index.chunk_size, len(index)) == (tree.attrs, tree.chunk_size, len(tree.entries))
    assert [index.entry(i) for i in range(len(index))] == tree.entries
    assert [index.name(i) for i in range(len(index))] == [e.name for e in tree.entries]
    assert index.subdirs == 1


def test_fields_make_the_attributes_type_asked_for() -> None:
    index = TreeIndex(sample().encode())
    i = index.index_of(b"x")
    assert i is not None
    name, attrs, data = index.fields(i, Stat)
    assert type(attrs) is Stat and attrs.blocks is None
    assert (name, attrs.xattrs, data) == (b"x", ((b"user.k", b"v" * 300),), b"")


def test_index_of_finds_every_name_and_no_other() -> None:
    index = TreeIndex(sample().encode())
    for i in range(len(index)):
        assert index.index_of(index.name(i)) == i
    for missing in (b"", b"a", b"filf", b"file0", b"zzz", b"sub/x"):
        assert index.index_of(missing) is None


def test_an_empty_tree() -> None:
    plain = Tree(Attrs(mode=stat.S_IFDIR | 0o755), 4096).encode()
    index = TreeIndex(plain)
    assert (len(index), index.subdirs, index.index_of(b"a")) == (0, 0, None)


@pytest.mark.parametrize("cut", [1, 4, 10, 40, 90, -1])
def test_a_truncated_blob_is_refused(cut: int) -> None:
    plain = sample().encode()
    for read in (Tree.decode, TreeIndex):
        with pytest.raises(Corruption):
            read(plain[:cut])


def test_trailing_bytes_and_a_wrong_magic_are_refused() -> None:
    plain = sample().encode()
    for bad in (plain + b"\0", b"XTRE" + plain[4:]):
        for read in (Tree.decode, TreeIndex):
            with pytest.raises(Corruption):
                read(bad)


names = st.sets(st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b), max_size=40)


@given(names)
def test_any_listing_reads_back_the_same(entry_names: set[bytes]) -> None:
    entries = [
        Entry(n, Attrs(mode=stat.S_IFREG | 0o644, size=i, ino=InodeNo(10 + i)), b"\x02" * 32)
        for i, n in enumerate(sorted(entry_names))
    ]
    plain = Tree(Attrs(mode=stat.S_IFDIR | 0o700), 65536, entries).encode()
    index = TreeIndex(plain)
    assert [index.entry(i) for i in range(len(index))] == Tree.decode(plain).entries
    for e in entries:
        i = index.index_of(e.name)
        assert i is not None and index.entry(i) == e
