"""Kept space figures through the CLI: after kill -9 at the points of the operations that
change them, at scale (10,000 volumes; one map of millions of entries), and the
listings' paging and its bad input. Each test asserts figures, never times."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from casfs import catalog, images, volumes
from casfs.catalog import figures as kept
from casfs.cli.output import figure
from casfs.kinds import BlobKind
from casfs.refcount import accounts
from casfs.repo import Repository
from casfs.snapshots import chunkmap
from tests.helpers.cli import casfs, js, killed_at, ok
from tests.helpers.fsck import assert_consistent, query

CHUNK = 32 << 10


def _disk(tmp_path: Path, chunks: int = 24) -> Path:
    path = tmp_path / "disk.raw"
    rnd = random.Random(1)
    path.write_bytes(b"".join(rnd.randbytes(CHUNK) if i % 3 else bytes(CHUNK) for i in range(chunks)))
    return path


def _counted(store: Path) -> None:
    """Every figure equal to a full count: what fsck checks (pending ones are no drift),
    then, after gc has counted them all, nothing pending and the listing exact."""
    assert_consistent(store)
    ok(store, "gc")
    assert query(store, "SELECT COUNT(*) FROM figures WHERE pending != 0") == [(0,)]
    assert_consistent(store)
    repo = Repository.open(store)
    try:
        for v in js(store, "volume", "ls"):
            counted = accounts.count(repo, kept.volume(v["name"]))
            assert counted is not None and v["pending"] == []
            assert (v["stored"], v["written"], v["unique"]) == (
                counted.stored + v["local"],
                counted.written + v["local"],
                counted.unique + v["local"],
            )
    finally:
        repo.close()


FOLD = """
import sys
from casfs.ids import ROOT_INO
from casfs.repo import Repository
from casfs.vfs.volume import open_volume
repo = Repository.open(sys.argv[1])
view = open_volume(repo, sys.argv[2])
view.write_sync(ROOT_INO, 3 * 32768, b"x" * 40000)
view.close()
"""


@pytest.mark.parametrize(
    "point", ["fold:before-publish", "fold:after-publish", "figures:counted", "import:after-commit"]
)
def test_figures_survive_a_kill_at_each_point(store: Path, tmp_path: Path, point: str) -> None:
    ok(store, "image", "import", "disk", str(_disk(tmp_path)))
    ok(store, "volume", "create", "a", "--from", "disk")
    ok(store, "volume", "create", "b", "--from", "disk")
    ok(store, "snapshot", "create", "a")
    if point.startswith("fold"):
        env = {**os.environ, "CASFS_FAULT": point, "PYTHONPATH": os.getcwd()}
        p = subprocess.run([sys.executable, "-c", FOLD, str(store), "a"], env=env, timeout=120)
        assert p.returncode == -9
        ok(store, "snapshot", "create", "a")  # recovers the dead view, folds what it left
    elif point == "figures:counted":
        # A listing's settle killed between its count and its write: the figures it
        # counted stay pending (the fold below marked them), nothing half-written.
        env = {**os.environ, "PYTHONPATH": os.getcwd()}
        subprocess.run([sys.executable, "-c", FOLD, str(store), "b"], env=env, timeout=120, check=True)
        killed_at(store, point, "volume", "ls")
    else:
        killed_at(store, point, "image", "import", "disk2", str(_disk(tmp_path, 30)))
        # Committed with its row at every figure pending: not yet counted.
        assert query(store, "SELECT pending FROM figures WHERE subject = 'image:disk2'") == [(kept.ALL,)]
    ok(store, "volume", "ls")
    _counted(store)


@pytest.mark.parametrize("point", ["create:after-commit", "delete:after-phase"])
def test_figures_after_a_killed_clone_or_delete(store: Path, tmp_path: Path, point: str) -> None:
    ok(store, "image", "import", "disk", str(_disk(tmp_path)))
    ok(store, "volume", "create", "a", "--from", "disk")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    subprocess.run([sys.executable, "-c", FOLD, str(store), "a"], env=env, timeout=120, check=True)
    if point == "create:after-commit":
        killed_at(store, point, "volume", "create", "c", "--from", "a@1")
    else:
        killed_at(store, point, "volume", "rm", "a")
    ok(store, "volume", "ls")
    _counted(store)


def test_ten_thousand_volumes_list_with_their_figures(tmp_path: Path) -> None:
    store = tmp_path / "store"
    repo = Repository.init(store)
    try:
        images.import_image(repo, "disk", _disk(tmp_path, 40))
        for i in range(10_000):
            volumes.create_volume(repo, f"v{i:05d}", volumes.Source(image="disk"))
        image = accounts.image_figures(repo, "disk")
    finally:
        repo.close()
    listed = js(store, "volume", "ls")
    assert len(listed) == 10_000 and [v["name"] for v in listed] == sorted(v["name"] for v in listed)
    assert image.stored > 0 and image.unique == 0 and image.pending == 0
    for v in listed:
        assert (v["stored"], v["written"], v["unique"], v["pending"]) == (image.stored, 0, 0, []), v
        assert v["logical"] == v["size"] == 40 * CHUNK
    # Pages of a listing: the same volumes, in order, whatever the page size.
    paged: list[str] = []
    after: list[str] = []
    while True:
        page = js(store, "volume", "ls", "--limit", "3333", *after)
        if not page:
            break
        paged += [v["name"] for v in page]
        after = ["--after", page[-1]["name"]]
    assert paged == [v["name"] for v in listed]
    info = js(store, "volume", "info", "v04242")
    assert (info["stored"], info["unique"], info["written"]) == (image.stored, 0, 0)


def test_a_map_of_millions_of_entries(tmp_path: Path) -> None:
    """A 64 GiB disk image of 2 million chunks over 97 distinct ones (built through the
    ledger, as an importer does: reading 64 GiB would take minutes), and a 1 TiB blank
    volume: `volume info` and `volume ls` give their figures."""
    store = tmp_path / "store"
    repo = Repository.init(store)
    try:
        count = 2 << 20
        rnd = random.Random(5)
        with repo.batch() as b:
            pool = [b.put(rnd.randbytes(CHUNK)) for _ in range(97)]
            ids = [pool[k] for k in rnd.choices(range(97), k=count)]
            root = chunkmap.build_map(b.put_kind, ids, count * CHUNK, CHUNK)

            def finish(c: object) -> None:
                assert isinstance(c, type(repo.conn))
                c.execute(
                    "INSERT INTO images (name, kind, phase, root, size, chunk_size, created) "
                    "VALUES ('big', 'block', 'ready', ?, ?, ?, 0)",
                    (root, count * CHUNK, CHUNK),
                )

            b.commit({root: 1}, then=finish)  # (no figures row: all pending, as after a crash)
        accounts.settle(repo, [kept.image("big")], None)
        volumes.create_volume(repo, "vm", volumes.Source(image="big"))
        volumes.create_volume(repo, "huge", volumes.Source(blank_block=1 << 40))
        query_pages = "SELECT COUNT(*) FROM blobs WHERE kind = ?"
        pages = repo.conn.execute(query_pages, (BlobKind.MAP_PAGE,)).fetchone()
        with catalog.read_transaction(repo.conn):
            all_stored = repo.conn.execute("SELECT SUM(stored) FROM blobs").fetchone()[0]
            huge_stored = all_stored - accounts.image_figures(repo, "big", budget=None).stored
    finally:
        repo.close()
    assert pages[0] == count // 1024  # (every page differs: millions of entries, thousands of pages)
    info = js(store, "volume", "info", "vm")
    # Everything the store holds but the blank volume's map is the image's, shared by vm.
    assert (info["size"], info["pending"]) == (count * CHUNK, [])
    assert info["stored"] == all_stored - huge_stored and info["unique"] == 0 and info["written"] == 0
    huge = js(store, "volume", "info", "huge")
    got = (huge["size"], huge["stored"], huge["unique"], huge["pending"])
    assert got == (1 << 40, huge_stored, huge_stored, [])
    assert 0 < huge_stored < 64 << 10  # a map of holes
    listed = {v["name"]: v["stored"] for v in js(store, "volume", "ls")}
    assert listed == {"huge": huge_stored, "vm": info["stored"]}
    image = js(store, "image", "info", "big")
    assert (image["stored"], image["unique"]) == (info["stored"], 0)


# -- paging and its bad input ------------------------------------------------------------


def test_paging_semantics(store: Path, tmp_path: Path) -> None:
    ok(store, "image", "import", "disk", str(_disk(tmp_path, 3)))
    for name in ("a", "b", "d"):
        ok(store, "volume", "create", name, "--from", "disk")

    def names(*a: str) -> list[str]:
        return [v["name"] for v in js(store, "volume", "ls", *a)]

    assert names("--limit", "2") == ["a", "b"]
    assert names("--after", "a") == ["b", "d"]
    # A cursor that is no volume (removed since the last page): the names after it.
    assert names("--after", "c") == ["d"] and names("--after", "d") == [] and names("--after", "0") == names()
    assert [i["name"] for i in js(store, "image", "ls", "--after", "disk")] == []
    for _ in range(3):
        ok(store, "snapshot", "create", "a")

    def snaps(*a: str) -> list[int]:
        return [s["n"] for s in js(store, "snapshot", "ls", "a", *a)]

    assert snaps("--after", "1") == [2, 3] and snaps("--limit", "1", "--after", "1") == [2]
    assert "STORED" in ok(store, "volume", "ls", "--limit", "1").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["volume", "ls", "--limit", "0"], "invalid --limit '0': expected an integer >= 1"),
        (["volume", "ls", "--limit=-3"], "invalid --limit '-3'"),
        (["volume", "ls", "--limit", "ten"], "invalid --limit 'ten'"),
        (["image", "ls", "--limit", "0"], "invalid --limit"),
        (["volume", "ls", "--after", "no/such"], "invalid --after name 'no/such'"),
        (["image", "ls", "--after", ""], "invalid --after name ''"),
        (["snapshot", "ls", "v", "--after", "x"], "invalid --after 'x': expected a snapshot number"),
        (["snapshot", "ls", "v", "--limit", "0"], "invalid --limit"),
    ],
)
def test_bad_paging_is_a_usage_error(store: Path, args: list[str], message: str) -> None:
    ok(store, "volume", "create", "v", "--blank-dir")
    p = casfs(store, *args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert message in p.stderr and len(p.stderr.strip().splitlines()) == 1 and p.stdout == ""


def test_fsck_reports_a_drifted_figure_and_repair_sets_the_count(store: Path, tmp_path: Path) -> None:
    ok(store, "image", "import", "disk", str(_disk(tmp_path)))
    ok(store, "volume", "create", "a", "--from", "disk")
    right = js(store, "volume", "info", "a")
    with sqlite3.connect(store / "catalog.db") as conn:
        conn.execute("UPDATE figures SET uniq = 12345 WHERE subject = 'volume:a'")
        conn.execute("UPDATE blob_totals SET stored = stored + 7")
    conn.close()
    p = casfs(store, "fsck")
    assert p.returncode == 5, p.stdout
    assert "volume:a: unique 12345 kept, 0 counted" in p.stdout and "blob totals" in p.stdout
    ok(store, "fsck", "--repair")
    assert js(store, "volume", "info", "a")["unique"] == right["unique"] == 0
    assert_consistent(store)


def test_a_pending_figure_is_marked_in_tables() -> None:
    doc = {"stored": 3 << 20, "unique": 0, "pending": ["stored"]}
    assert (figure(doc, "stored"), figure(doc, "unique")) == ("~3.0 MiB", "0 B")
