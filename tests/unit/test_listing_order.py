"""Listing.after(): readdir's cached cookie order stays right while a directory changes."""

from __future__ import annotations

import random

from casfs.ids import FIRST_FREE_INO, ROOT_INO, InodeNo
from casfs.vfs.overlay.nodes import Listing


def reference(listing: Listing, offset: int) -> list[tuple[int, bytes, int]]:
    return sorted((c, name, ino) for name, (c, ino) in listing.entries.items() if c > offset)


def test_after_matches_a_fresh_sort_under_random_changes() -> None:
    rnd = random.Random(3)
    listing = Listing()
    names = [f"n{i}".encode() for i in range(60)]
    for step in range(3000):
        op = rnd.random()
        name = rnd.choice(names)
        if op < 0.45 and name not in listing.entries:
            listing.add(name, InodeNo(step))
        elif op < 0.75 and name in listing.entries:
            listing.remove(name)  # unlink and rename
        elif name in listing.entries:
            listing.replace(name, InodeNo(step))  # RENAME_EXCHANGE
        offset = rnd.choice([0, rnd.randrange(listing.next_cookie + 1)])
        assert list(listing.after(offset)) == reference(listing, offset)


def test_a_reloaded_listing_reads_in_cookie_order() -> None:
    """As a remount loads it: the header (next cookie) and the entry rows."""
    listing = Listing()
    for name in (b"c", b"a", b"b"):
        listing.add(name, InodeNo(7))
    listing.remove(b"a")
    listing.add(b"a", InodeNo(8))
    again = Listing.from_header(listing.header(), dict(listing.entries))
    assert [n for _, n, _ in again.after(0)] == [b"c", b"b", b"a"]
    assert [n for _, n, _ in again.after(2)] == [b"b", b"a"]
    again.add(b"d", InodeNo(9))
    assert again.entries[b"d"][0] == 5  # above every stored cookie


def test_pending_names_only_what_changed_since_the_last_commit() -> None:
    listing = Listing()
    listing.add(b"x", ROOT_INO)
    assert listing.pending() == (True, [(b"x", 1, 1)], [])  # just copied up: all of it
    listing.committed()
    listing.add(b"y", FIRST_FREE_INO)
    listing.remove(b"x")
    whole, present, gone = listing.pending()
    assert (whole, present, gone) == (False, [(b"y", 2, 2)], [b"x"])
    listing.committed()
    assert listing.pending() == (False, [], [])
