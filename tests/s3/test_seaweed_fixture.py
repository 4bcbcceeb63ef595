"""The SeaweedFS fixture itself: a real server, a bucket, a fresh prefix per test."""

from __future__ import annotations

import obstore

from tests.helpers.seaweed import Seaweed


def test_the_server_stores_objects_under_a_fresh_prefix(seaweed: Seaweed, s3_prefix: str) -> None:
    store = seaweed.obstore(s3_prefix)
    assert [o for page in obstore.list(store) for o in page] == []
    obstore.put(store, "x", b"hello", mode="create")
    assert bytes(obstore.get_range(store, "x", start=1, length=3)) == b"ell"
    assert seaweed.proc is None or seaweed.proc.poll() is None  # (None: an external server)
