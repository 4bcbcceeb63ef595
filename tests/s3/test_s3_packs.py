"""What only a pack store does: whole packs go when their last blob dies, mostly dead
packs are rewritten by compact (gc's repack), one store per prefix."""

from __future__ import annotations

import os
import time
from pathlib import Path

import obstore
import pytest

from casfs.store.ids import BlobId, blob_id
from casfs.store.s3.location import Location
from casfs.store.s3.spans import READ_AHEAD, SPAN
from casfs.store.s3.store import S3BlobStore, connect
from tests.helpers.cli import CLI, TIMEOUT, run
from tests.helpers.cli import env as cli_env
from tests.helpers.seaweed import BUCKET, Seaweed


@pytest.fixture
def store(seaweed: Seaweed, s3_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> S3BlobStore:
    for k, v in seaweed.env().items():
        monkeypatch.setenv(k, v)
    s = connect(tmp_path / "store", Location(BUCKET, s3_prefix))
    s.create()
    return s


def _keys(store: S3BlobStore, prefix: str) -> dict[str, int]:
    return {m["path"]: m["size"] for page in obstore.list(store.remote.store, prefix=prefix) for m in page}


def _stage(store: S3BlobStore, n: int) -> dict[BlobId, bytes]:
    blobs = {}
    st = store.staging()
    for _ in range(n):
        plain = os.urandom(50_000)
        bid = blob_id(plain)
        st.add(bid, plain)
        blobs[bid] = plain
    st.publish()
    return blobs


def test_a_pack_goes_with_its_last_blob_and_a_fresh_store_agrees(store: S3BlobStore, tmp_path: Path) -> None:
    blobs = _stage(store, 4)
    assert len(_keys(store, "packs/")) == 1
    ids = list(blobs)
    store.delete(ids[0])
    assert len(_keys(store, "dead/")) == 1
    other = connect(tmp_path / "other", store.loc)  # another process's view, from the bucket
    assert sorted(other.list()) == sorted(ids[1:])
    for bid in ids[1:]:
        store.delete(bid)
    assert _keys(store, "") == {}
    assert list(other.list()) == []


def test_compact_rewrites_mostly_dead_packs_and_keeps_every_live_blob(store: S3BlobStore) -> None:
    blobs = _stage(store, 10)
    kept = _stage(store, 10)  # a second pack, all live: left alone
    ids = list(blobs)
    for bid in ids[:8]:
        store.delete(bid)
    before = sum(_keys(store, "packs/").values())
    assert store.compact(0.1) == (0, 0)  # 20% live: over the threshold
    packs, reclaimed = store.compact(0.5)
    assert packs == 1 and reclaimed > 300_000
    assert sum(_keys(store, "packs/").values()) == before - reclaimed
    assert _keys(store, "dead/") == {}
    assert sorted(store.list()) == sorted([*ids[8:], *kept])
    for bid in [*ids[8:], *kept]:
        assert store.get(bid) == {**blobs, **kept}[bid]


def test_one_store_per_prefix(seaweed: Seaweed, s3_prefix: str, tmp_path: Path) -> None:
    env = cli_env(CASFS_TEST_TIMEOUTS="0", **seaweed.env())
    url = f"s3://{BUCKET}/{s3_prefix}"

    def casfs(store: Path, *args: str) -> tuple[int, str]:
        done = run([*CLI, "-s", store, *args], timeout=TIMEOUT, env=env)
        return done.returncode, done.stderr

    assert casfs(tmp_path / "one", "init", "--blobs", url)[0] == 0
    assert casfs(tmp_path / "one", "init", "--blobs", url)[0] == 0  # itself again: fine
    code, err = casfs(tmp_path / "two", "init", "--blobs", url)
    assert code == 4 and "give each store its own prefix" in err
    assert not (tmp_path / "two").exists()
    assert casfs(tmp_path / "two", "init", "--blobs", f"{url}-two")[0] == 0


def test_a_sequential_reader_finds_the_next_spans_fetched_ahead(store: S3BlobStore, tmp_path: Path) -> None:
    """Reading a pack's blobs in order, from a host that has none cached: the second
    span's miss fetches the next READ_AHEAD spans at once (into the disk cache), and
    spans further on only when the reader gets near them."""
    blobs = _stage(store, 150)  # 50 kB of random bytes each: one pack of about 7 MB
    host = connect(tmp_path / "host2", store.loc)
    host.create()
    cell = {bid: host._locate(bid)[0][1] // SPAN for bid in blobs}
    assert READ_AHEAD >= 1 and max(cell.values()) > READ_AHEAD + 2

    def cached(c: int) -> bool:
        return all(host.cache.get(b) is not None for b in blobs if cell[b] == c)

    for bid in blobs:  # the reader: the first two spans
        if cell[bid] <= 1:
            assert host.get(bid) == blobs[bid]
    deadline = time.monotonic() + 30
    while not all(cached(c) for c in range(2, READ_AHEAD + 2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(cached(c) for c in range(2, READ_AHEAD + 2))
    assert not cached(READ_AHEAD + 2)
    for bid, plain in blobs.items():  # and on to the end: every blob reads back verified
        assert host.get(bid) == plain
