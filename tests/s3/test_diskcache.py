"""The local cache of fetched blobs: bounded, least recently used out, damage dropped."""

from __future__ import annotations

import os
from pathlib import Path

from casfs.store.ids import blob_id
from casfs.store.s3.diskcache import DiskCache

KIB = 1 << 10


def test_the_cache_stays_within_its_size_and_drops_the_oldest(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "c", 1024 * KIB)
    ids = []
    for i in range(40):
        data = os.urandom(64 * KIB)
        bid = blob_id(data)
        cache.put(bid, data)
        path = tmp_path / "c" / bid.hex()[:2] / bid.hex()
        os.utime(path, (1000 + i, 1000 + i))  # the order of use, coarser than the clock
        ids.append((bid, data))
    assert cache.size_bytes <= 1024 * KIB
    assert sum(p.stat().st_size for p in (tmp_path / "c").rglob("*") if p.is_file()) <= 1024 * KIB
    assert cache.get(ids[-1][0]) == ids[-1][1]
    assert cache.get(ids[0][0]) is None
    assert cache.get(ids[-1][0], max_size=10) is None


def test_a_blob_larger_than_a_tenth_is_not_cached_and_zero_turns_it_off(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "c", 100 * KIB)
    data = os.urandom(20 * KIB)
    cache.put(blob_id(data), data)
    assert cache.get(blob_id(data)) is None
    off = DiskCache(tmp_path / "off", 0)
    off.put(blob_id(b"x"), b"x")
    assert off.get(blob_id(b"x")) is None and not (tmp_path / "off").exists()
