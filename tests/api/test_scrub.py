"""casfs scrub without a mount: what it reads, what it names for each damaged blob,
healing from another store, resuming after a kill, and its errors."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from casfs import images, volumes
from casfs.ids import ChunkNo
from casfs.repo import Repository
from casfs.snapshots.chunkmap import Content, MapRoot
from casfs.snapshots.tree import Tree
from casfs.store.ids import ZERO_ID, BlobId
from casfs.upkeep import scrub
from tests.helpers import blobs as blob_files
from tests.helpers.cli import casfs, fails, js, killed_at, ok

CHUNK = 64 << 10
BLOCK_CHUNK = 4096
BLOCK_CHUNKS = 1100  # more than one map page (1,024 chunk ids)


@pytest.fixture
def sources(tmp_path: Path) -> tuple[Path, Path]:
    """A directory tree and a disk image of two map pages, to import."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "hello.txt").write_text("hello\n")
    (src / "sub" / "big.bin").write_bytes(os.urandom(5 * CHUNK + 10))
    disk = tmp_path / "disk.raw"
    with open(disk, "wb") as f:
        for n in range(BLOCK_CHUNKS):
            f.write(os.urandom(BLOCK_CHUNK) if n % 7 == 0 else bytes(BLOCK_CHUNK))
    return src, disk


def populate(repo: Repository, src: Path, disk: Path) -> None:
    """Images `tree` and `disk`, a clone `vm` of the tree with a snapshot, and `blk`."""
    images.import_image(repo, "tree", src, chunk_size=CHUNK)
    images.import_image(repo, "disk", disk, chunk_size=BLOCK_CHUNK)
    volumes.create_volume(repo, "vm", volumes.Source(image="tree"))
    volumes.create_snapshot(repo, "vm", "one")
    volumes.create_volume(repo, "blk", volumes.Source(image="disk"))


@pytest.fixture
def store(repo: Repository, sources: tuple[Path, Path]) -> Repository:
    populate(repo, *sources)
    return repo


def tree_entry(repo: Repository, *path: str) -> tuple[BlobId, int]:
    """(blob, size) of a path in image `tree`: a subtree's id, or a file's content."""
    bid = BlobId(bytes.fromhex(images.get_image(repo, "tree").root or ""))
    size = 0
    for name in path:
        entry = Tree.decode(repo.get(bid)).find(name.encode())
        assert entry is not None
        bid, size = entry.blob, entry.attrs.size
    return bid, size


def big_chunk(repo: Repository, n: int) -> BlobId:
    content, size = tree_entry(repo, "sub", "big.bin")
    victim = Content(repo.get, content, size, CHUNK).chunk(ChunkNo(n))
    assert victim != ZERO_ID
    return victim


def holders(report: scrub.ScrubReport, blob: BlobId) -> set[tuple[str, str, int, int]]:
    (damage,) = [d for d in report.damaged if d.blob == blob.hex()]
    return {(h.subject, h.path, h.start, h.end) for h in damage.holders}


def run(repo: Repository, **which: str) -> scrub.ScrubReport:
    return scrub.Scrubber(repo).scrub(scrub.roots(repo, **which), scrub.state_path(repo))


def test_a_healthy_store_is_clean_and_every_blob_is_read(store: Repository) -> None:
    report = run(store)
    assert report.clean and report.damaged == []
    assert report.roots == 5  # two images, two volume bases, one snapshot
    # every blob once: the clone and the snapshot share the image's
    (count,) = store.conn.execute("SELECT count(*) FROM blobs WHERE refs > 0").fetchone()
    assert report.blobs == count
    assert not scrub.state_path(store).exists()  # finished: nothing to resume


@pytest.mark.no_fsck("a blob is damaged on purpose")
def test_a_damaged_chunk_is_named_by_everything_that_holds_it(store: Repository) -> None:
    victim = big_chunk(store, 2)
    blob_files.corrupt(store, victim)
    report = run(store)
    assert not report.clean
    where = ("/sub/big.bin", 2 * CHUNK, 3 * CHUNK)
    assert holders(report, victim) == {
        ("image tree", *where),
        ("volume vm", *where),
        ("snapshot vm@1", *where),
    }
    (damage,) = report.damaged
    assert (damage.problem, damage.kind) == ("corrupt", "data")
    assert victim in store.blobs.damaged()  # recorded as any read records it
    assert run(store, volume="blk").clean  # what does not hold it is clean


@pytest.mark.no_fsck("a blob is damaged on purpose")
def test_a_damaged_tree_and_a_missing_map_page(store: Repository) -> None:
    sub, _ = tree_entry(store, "sub")
    blob_files.corrupt(store, sub)
    disk_root = BlobId(bytes.fromhex(images.get_image(store, "disk").root or ""))
    root = MapRoot.decode(store.get(disk_root))
    assert root.depth == 1 and root.ids[1] != ZERO_ID
    blob_files.remove(store, root.ids[1])
    report = run(store)
    assert holders(report, sub) == {(s, "/sub", 0, 0) for s in ("image tree", "volume vm", "snapshot vm@1")}
    page = [d for d in report.damaged if d.blob == root.ids[1].hex()]
    assert [(d.problem, d.kind) for d in page] == [("missing", "map page")]
    span = (1024 * BLOCK_CHUNK, BLOCK_CHUNKS * BLOCK_CHUNK)
    assert holders(report, root.ids[1]) == {("image disk", "", *span), ("volume blk", "", *span)}


@pytest.mark.no_fsck("a blob no source holds stays damaged")
def test_heal_from_another_store(store: Repository, sources: tuple[Path, Path], tmp_path: Path) -> None:
    other = tmp_path / "other"
    ok(other, "init")
    with contextlib.closing(Repository.open(other)) as good:
        images.import_image(good, "tree", sources[0], chunk_size=CHUNK)  # the same content
    victims = [big_chunk(store, 1), big_chunk(store, 3)]
    for v in victims:
        blob_files.corrupt(store, v)
    disk_root = BlobId(bytes.fromhex(images.get_image(store, "disk").root or ""))
    lone = MapRoot.decode(store.get(disk_root)).ids[0]  # a page only this store has
    blob_files.corrupt(store, lone)

    done = casfs(store.path, "scrub", "--heal-from", other, "--json")
    assert done.returncode == 5, done.stderr
    report = json.loads(done.stdout)
    healed = {d["blob"]: d for d in report["damaged"]}
    assert {v.hex() for v in victims} <= healed.keys()
    assert all(healed[v.hex()]["healed_from"] == str(other) for v in victims)
    assert healed[lone.hex()]["healed_from"] is None
    assert str(other) in healed[lone.hex()]["unhealed"]
    # the healed chunks read right, through their check; the lone page still fails
    content, size = tree_entry(store, "sub", "big.bin")
    data = b"".join(
        store.blobs.get(Content(store.get, content, size, CHUNK).chunk(ChunkNo(n))) for n in range(6)
    )
    assert data == (sources[0] / "sub" / "big.bin").read_bytes()
    assert set(victims).isdisjoint(store.blobs.damaged())
    again = json.loads(casfs(store.path, "scrub", "--json").stdout)
    assert [d["blob"] for d in again["damaged"]] == [lone.hex()]


@pytest.mark.no_fsck("a blob is damaged on purpose")
def test_an_interrupted_scrub_resumes_after_the_last_root_it_finished(store: Repository) -> None:
    victim = big_chunk(store, 0)
    blob_files.corrupt(store, victim)
    killed_at(store.path, "scrub:after-root", "scrub")
    state = json.loads(scrub.state_path(store).read_text())
    assert len(state["done"]) == 1
    done = casfs(store.path, "scrub")
    assert done.returncode == 5
    assert "resumed after 1" in done.stdout
    assert victim.hex() in done.stdout and "held by image tree: /sub/big.bin bytes 0-65536" in done.stdout
    assert not scrub.state_path(store).exists()


@pytest.mark.no_fsck("a blob is corrupted on purpose")
def test_scrub_is_one_pass_per_blob_even_for_many_clones(store: Repository) -> None:
    for i in range(20):
        volumes.create_volume(store, f"c{i}", volumes.Source(image="tree"))
    blob_files.corrupt(store, big_chunk(store, 4))
    report = run(store)
    (count,) = store.conn.execute("SELECT count(*) FROM blobs WHERE refs > 0").fetchone()
    assert report.blobs == count - 1  # each blob read once; the damaged one failed
    (damage,) = report.damaged
    assert len(damage.holders) == 1 + 1 + 1 + 20  # the image, vm, vm@1 and the clones


def test_scrub_errors(store: Repository) -> None:
    assert "volume 'nope'" in fails(store.path, 3, "scrub", "--volume", "nope")
    fails(store.path, 2, "scrub", "--rate", "fast")
    assert js(store.path, "scrub", "--json")["clean"] is True
    done = casfs(store.path, "scrub", "--rate", "100M", "--image", "tree")
    assert done.returncode == 0 and "scrubbed 1 root(s)" in done.stdout


def test_fsck_repair_heals_from_another_store(
    store: Repository, sources: tuple[Path, Path], tmp_path: Path
) -> None:
    other = tmp_path / "other"
    ok(other, "init")
    with contextlib.closing(Repository.open(other)) as good:
        images.import_image(good, "tree", sources[0], chunk_size=CHUNK)
    blob_files.corrupt(store, big_chunk(store, 1))
    blob_files.remove(store, big_chunk(store, 2))
    fails(store.path, 2, "fsck", "--heal-from", other)
    done = casfs(store.path, "fsck", "--repair", "--heal-from", other)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(f"(healed from {other})") == 2
    ok(store.path, "fsck")  # clean now


def test_heal_from_the_stores_this_one_pulled_from(sources: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for s in (a, b):
        ok(s, "init")
    ok(a, "image", "import", "tree", sources[0], "--chunk-size", str(CHUNK))
    ok(a, "volume", "create", "vm", "--from", "tree")
    ok(a, "snapshot", "create", "vm")
    ok(b, "pull", a, "vm")
    with contextlib.closing(Repository.open(b)) as repo:
        (snap,) = volumes.list_snapshots(repo, "vm")
        sub = Tree.decode(repo.get(BlobId(bytes.fromhex(snap.root)))).find(b"sub")
        assert sub is not None
        big = Tree.decode(repo.get(sub.blob)).find(b"big.bin")
        assert big is not None
        victim = Content(repo.get, big.blob, big.attrs.size, CHUNK).chunk(ChunkNo(3))
        blob_files.corrupt(repo, victim)
    fails(b, 2, "scrub", "--heal-from", a, "--heal-from-peers")
    done = casfs(b, "scrub", "--heal-from-peers", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (damage,) = json.loads(done.stdout)["damaged"]
    assert (damage["blob"], damage["healed_from"]) == (victim.hex(), str(a))
    assert js(b, "scrub", "--json")["damaged"] == []


@pytest.mark.no_fsck("a blob is damaged on purpose, and no other store holds it")
def test_heal_from_peers_with_none_says_so(store: Repository) -> None:
    blob_files.corrupt(store, big_chunk(store, 0))
    done = casfs(store.path, "scrub", "--heal-from-peers", "--json")
    assert done.returncode == 5
    (damage,) = json.loads(done.stdout)["damaged"]
    assert "pulled from no other store" in damage["unhealed"]
