"""Two stores, one bucket (casfs.store.s3.pins, casfs.replica.adopt), on a real SeaweedFS
server: a pull between stores whose blobs share the bucket adopts them (no blob data
is copied: only catalog records move), both stores' gc keep what the other relies on,
a gc deleting a pack and an adoption racing for it never lose data, and a pull from
or to a store elsewhere copies as before.

Stores here are fsck'd by the tests themselves (the environment holds the AWS
settings only while the test runs)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from casfs.repo import Repository
from casfs.store.s3 import packfmt, pins
from casfs.store.s3.store import S3BlobStore
from casfs.store.s3.table import Foreign
from tests.helpers.fsck import fsck_clean
from tests.helpers.seaweed import BUCKET, Seaweed
from tests.replica.conftest import Sshd
from tests.replica.helpers import MiB, block_volume, cli, exported, root_of, write_block


@pytest.fixture
def pair(s3_env: Seaweed, s3_prefix: str, tmp_path: Path) -> tuple[Path, Path]:
    """Stores a and b, each with its own prefix of the bucket."""
    for name in ("a", "b"):
        p = cli(tmp_path / name, "init", "--blobs", f"s3://{BUCKET}/{s3_prefix}/{name}")
        assert p.returncode == 0, p.stderr
    return tmp_path / "a", tmp_path / "b"


def objects(seaweed: Seaweed, prefix: str, under: str = "") -> list[str]:
    import obstore

    return sorted(
        o["path"] for page in obstore.list(seaweed.obstore(prefix), prefix=under or None) for o in page
    )


def pull(store: Path, source: Path | str, *args: str, **env: str) -> dict[str, int | str]:
    p = cli(store, "pull", source, *args, "--json", extra=env)
    assert p.returncode == 0, p.stderr
    doc: dict[str, int | str] = json.loads(p.stdout)
    return doc


def ok(store: Path, *args: str | Path) -> None:
    p = cli(store, *args)
    assert p.returncode == 0, p.stderr


def gc(store: Path) -> None:
    ok(store, "gc")


def test_pull_through_the_bucket_moves_only_records_and_both_gcs_keep_what_the_other_uses(
    pair: tuple[Path, Path], s3_env: Seaweed, s3_prefix: str, tmp_path: Path
) -> None:
    a, b = pair
    block_volume(a, tmp_path, "vm1", 32 * MiB, os.urandom(12 * MiB))
    n = write_block(a, "vm1", [(20 * MiB, os.urandom(2 * MiB))])
    moved = pull(b, a, "vm1")
    assert (moved["n"], moved["plan"]) == (n, "new")
    assert int(moved["adopted"]) == int(moved["blobs"]) > 200 and moved["copied"] == 0
    assert int(moved["bytes"]) < 200_000  # records, not 14 MiB of blobs
    mine = objects(s3_env, f"{s3_prefix}/b")
    assert not [k for k in mine if k.startswith("packs/")], mine  # no blob data copied
    assert [k for k in mine if k.startswith("adopted/")]
    assert objects(s3_env, f"{s3_prefix}/a", "refs/")
    want = exported(a, f"vm1@{n}", tmp_path / "a.img")
    assert exported(b, f"vm1@{n}", tmp_path / "b.img") == want
    fsck_clean(a)
    fsck_clean(b)

    # The owner drops everything: its gc leaves the packs b relies on (all dead in a).
    ok(a, "volume", "rm", "vm1")
    ok(a, "image", "rm", "vm1-image")
    gc(a)
    assert objects(s3_env, f"{s3_prefix}/a", "packs/")
    assert not objects(s3_env, f"{s3_prefix}/a", "deleting/")
    p = cli(b, "snapshot", "export", f"vm1@{n}", tmp_path / "b2.img", extra={"CASFS_BLOB_CACHE": "0"})
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "b2.img").read_bytes() == want
    fsck_clean(a)
    fsck_clean(b)

    # The adopter drops it too: its gc removes its references, then a's gc the packs.
    ok(b, "volume", "rm", "vm1")
    gc(b)
    assert not objects(s3_env, f"{s3_prefix}/a", "refs/")
    assert not [k for k in objects(s3_env, f"{s3_prefix}/b") if k != packfmt.CLAIM]
    gc(a)
    assert [k for k in objects(s3_env, f"{s3_prefix}/a") if k != packfmt.CLAIM] == []
    fsck_clean(a)
    fsck_clean(b)


def test_pulls_go_on_through_the_bucket_and_back(
    pair: tuple[Path, Path], s3_env: Seaweed, s3_prefix: str, tmp_path: Path
) -> None:
    """The next snapshot adopts only what changed; a volume b wrote and a pulls back
    names blobs of both prefixes (a adopts b's, b's are in b's packs)."""
    a, b = pair
    block_volume(a, tmp_path, "vm1", 16 * MiB, os.urandom(4 * MiB))
    write_block(a, "vm1", [(8 * MiB, os.urandom(MiB))])
    first = pull(b, a, "vm1")
    n = write_block(a, "vm1", [(0, os.urandom(256 << 10))])
    second = pull(b, a, "vm1")
    assert second["n"] == n and 4 <= int(second["adopted"]) < int(first["adopted"]) / 4
    m = write_block(b, "vm1", [(12 * MiB, os.urandom(512 << 10))])
    back = pull(a, b, "vm1")
    assert back["n"] == m and int(back["adopted"]) > 0 and back["copied"] == 0
    assert root_of(a, f"vm1@{m}") == root_of(b, f"vm1@{m}")
    assert exported(a, f"vm1@{m}", tmp_path / "a.img") == exported(b, f"vm1@{m}", tmp_path / "b.img")
    gc(a)
    gc(b)
    assert exported(a, f"vm1@{m}", tmp_path / "a2.img") == exported(b, f"vm1@{m}", tmp_path / "b2.img")
    fsck_clean(a)
    fsck_clean(b)


def test_a_gc_deleting_a_pack_and_an_adoption_never_both_win(
    pair: tuple[Path, Path], s3_env: Seaweed, s3_prefix: str, tmp_path: Path
) -> None:
    """The race, each way, stopped at the point that matters: a gc that wrote its
    deleting marker makes the adopter copy; an adopter's reference makes the gc keep
    the pack."""
    a, b = pair
    block_volume(a, tmp_path, "vm1", 8 * MiB, os.urandom(3 * MiB))
    n = write_block(a, "vm1", [(5 * MiB, os.urandom(MiB))])
    owner = s3_env.obstore(f"{s3_prefix}/a")
    import obstore

    packs = [k.split("/")[1] for k in objects(s3_env, f"{s3_prefix}/a", "packs/")]
    for name in packs:  # a's gc is deleting every pack: marker written, references not listed yet
        obstore.put(owner, packfmt.marker_key(name), b"{}")
    moved = pull(b, a, "vm1")
    assert moved["adopted"] == 0 and moved["copied"] == moved["blobs"]
    assert not objects(s3_env, f"{s3_prefix}/a", "refs/")  # the adopter backed off
    assert objects(s3_env, f"{s3_prefix}/b", "packs/")
    obstore.delete(owner, [packfmt.marker_key(name) for name in packs])
    want = exported(a, f"vm1@{n}", tmp_path / "a.img")
    assert exported(b, f"vm1@{n}", tmp_path / "b.img") == want

    # The other way: an adopter's reference is there when the gc looks.
    moved = pull(b, a, "vm1", "--as", "other")  # (b holds the blobs now: nothing to adopt)
    assert moved["adopted"] == 0
    with contextlib.closing(Repository.open(b)) as repo_b, contextlib.closing(Repository.open(a)) as repo_a:
        sb, sa = repo_b.blobs, repo_a.blobs
        assert isinstance(sb, S3BlobStore) and isinstance(sa, S3BlobStore)
        f = Foreign(sa.loc.prefix, sa.loc.store_id, packs[0])
        assert pins.pin(sb, f, "t1")
        assert not pins.may_remove(sa, packs[0])  # referenced: kept, marker gone again
        assert not objects(s3_env, f"{s3_prefix}/a", "deleting/")
        pins.unpin(sb, f, "t1")
        assert pins.may_remove(sa, packs[0])  # now it may go (marker written)...
        assert not pins.pin(sb, f, "t2")  # ...and an adopter coming now backs off
        pins.removed(sa, packs[0])
    assert not objects(s3_env, f"{s3_prefix}/a", "refs/")
    fsck_clean(a)
    fsck_clean(b)


def test_references_of_a_batch_that_died_are_removed(pair: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = pair
    block_volume(a, tmp_path, "vm1", 4 * MiB, os.urandom(MiB))
    with contextlib.closing(Repository.open(b)) as repo_b, contextlib.closing(Repository.open(a)) as repo_a:
        sb, sa = repo_b.blobs, repo_a.blobs
        assert isinstance(sb, S3BlobStore) and isinstance(sa, S3BlobStore)
        name = sorted(sa.table.names())[0]
        f = Foreign(sa.loc.prefix, sa.loc.store_id, name)
        staging = sb.staging()
        assert staging.pin({f: sa.table.packs[name].size}) == set()
        assert list(sa.remote.list(f"refs/{name}/"))
        # The process "died" here: the next recovery finds its .ref and unpins.
        sb.recover_staging(lambda pid: False)
        assert not list(sa.remote.list(f"refs/{name}/"))
        assert pins.may_remove(sa, name)  # (nothing holds the pack now)
        sa.remote.delete([packfmt.marker_key(name)])


def test_pulls_between_a_bucket_and_a_store_elsewhere_copy(
    s3_env: Seaweed, s3_prefix: str, tmp_path: Path
) -> None:
    s3, local = tmp_path / "s3", tmp_path / "local"
    assert cli(s3, "init", "--blobs", f"s3://{BUCKET}/{s3_prefix}").returncode == 0
    Repository.init(local).close()
    block_volume(s3, tmp_path, "vm1", 8 * MiB, os.urandom(2 * MiB))
    n = write_block(s3, "vm1", [(6 * MiB, os.urandom(MiB))])
    there = pull(local, s3, "vm1")
    assert there["adopted"] == 0 and int(there["bytes"]) > 3 * MiB
    m = write_block(local, "vm1", [(0, os.urandom(MiB))])
    back = pull(s3, local, "vm1")
    assert back["n"] == m > n and back["adopted"] == 0 and int(back["bytes"]) > MiB
    assert exported(s3, f"vm1@{m}", tmp_path / "a.img") == exported(local, f"vm1@{m}", tmp_path / "b.img")
    fsck_clean(s3)
    fsck_clean(local)


def test_an_image_pulled_through_the_bucket_is_adopted_and_outlives_its_owner(
    pair: tuple[Path, Path], s3_env: Seaweed, s3_prefix: str, tmp_path: Path
) -> None:
    from tests.api.test_roundtrip import make_tree
    from tests.helpers.trees import compare

    a, b = pair
    make_tree(tmp_path / "src")
    ok(a, "image", "import", "tree", tmp_path / "src")
    p = cli(b, "image", "pull", a, "tree", "--json")
    assert p.returncode == 0, p.stderr
    moved = json.loads(p.stdout)
    assert moved["plan"] == "new" and moved["adopted"] == moved["blobs"] > 0 and moved["copied"] == 0
    again = json.loads(cli(b, "image", "pull", a, "tree", "--json").stdout)
    assert again["plan"] == "have"
    info = json.loads(cli(b, "image", "info", "tree", "--json").stdout)
    assert info["root"] == moved["root"]
    ok(a, "image", "rm", "tree")
    gc(a)
    ok(b, "image", "export", "tree", tmp_path / "out")
    assert compare(tmp_path / "src", tmp_path / "out", ignore={"atime"}) == []
    fsck_clean(a)
    fsck_clean(b)


def test_killed_adopting_pulls_leave_no_reference_behind(
    pair: tuple[Path, Path], s3_env: Seaweed, s3_prefix: str, tmp_path: Path
) -> None:
    """SIGKILL at points of a pull through the bucket (after its pins, before its
    commit), then run again: it completes, and every reference left in the owner's
    prefix is one of the adopter's adopted objects."""
    import random

    a, b = pair
    block_volume(a, tmp_path, "vm1", 64 * MiB, os.urandom(40 * MiB))  # 640 chunks under a map root
    n = write_block(a, "vm1", [(50 * MiB, os.urandom(MiB))])
    for point in sorted(random.sample(range(2_000, 60_000), 3)):
        p = cli(b, "pull", a, "vm1", extra={"CASFS_KILL_AFTER_BYTES": f"receiver:{point}"})
        assert p.returncode == -9, p.stderr  # (the answer naming the 657 chunks is longer)
        assert objects(s3_env, f"{s3_prefix}/a", "refs/")  # the map root's pack, pinned
    moved = pull(b, a, "vm1")
    assert moved["plan"] in ("new", "have")
    assert exported(a, f"vm1@{n}", tmp_path / "a.img") == exported(b, f"vm1@{n}", tmp_path / "b.img")
    adopted = {k.split("/")[1] for k in objects(s3_env, f"{s3_prefix}/b", "adopted/")}
    refs = {k.split("/")[1] + "." + k.rsplit(".", 1)[1] for k in objects(s3_env, f"{s3_prefix}/a", "refs/")}
    assert refs == adopted
    ok(b, "volume", "rm", "vm1")
    gc(b)
    assert not objects(s3_env, f"{s3_prefix}/a", "refs/")
    fsck_clean(a)
    fsck_clean(b)


def test_two_stores_running_gc_at_once_keep_each_others_blobs(
    pair: tuple[Path, Path], s3_env: Seaweed, s3_prefix: str, tmp_path: Path
) -> None:
    """Each store relies on the other's packs (a pull each way), drops its own copy of
    what the other keeps, and both run gc at the same time, twice: every snapshot left
    still exports the same from both, fsck is clean on both."""
    import subprocess

    from tests.helpers.cli import CLI, TIMEOUT, env

    a, b = pair
    block_volume(a, tmp_path, "vm1", 16 * MiB, os.urandom(6 * MiB))
    one = write_block(a, "vm1", [(8 * MiB, os.urandom(2 * MiB))])
    pull(b, a, "vm1")
    two = write_block(b, "vm1", [(0, os.urandom(3 * MiB)), (12 * MiB, os.urandom(MiB))])
    pull(a, b, "vm1")
    three = write_block(a, "vm1", [(4 * MiB, os.urandom(MiB))])
    pull(b, a, "vm1")
    want = exported(a, f"vm1@{three}", tmp_path / "want.img")
    for store in (a, b):
        for n in (one, two):
            ok(store, "snapshot", "rm", f"vm1@{n}")
    for _ in range(2):
        procs = [
            subprocess.Popen(
                [*CLI, "-v", "-s", str(s), "gc"], env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            for s in (a, b)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=TIMEOUT)
            assert proc.returncode == 0, err.decode()[-4000:]
    for store, name in ((a, "a2.img"), (b, "b2.img")):
        p = cli(store, "snapshot", "export", f"vm1@{three}", tmp_path / name, extra={"CASFS_BLOB_CACHE": "0"})
        assert p.returncode == 0, p.stderr
        assert (tmp_path / name).read_bytes() == want
    fsck_clean(a)
    fsck_clean(b)


def test_a_pack_another_store_relies_on_is_not_repacked(
    pair: tuple[Path, Path], s3_env: Seaweed, s3_prefix: str, tmp_path: Path
) -> None:
    a, b = pair
    data = os.urandom(6 * MiB)
    (tmp_path / "one.raw").write_bytes(data)
    (tmp_path / "two.raw").write_bytes(data[:MiB] + bytes(MiB))
    ok(a, "image", "import", "one", tmp_path / "one.raw")
    ok(b, "image", "pull", a, "one")
    ok(a, "image", "import", "two", tmp_path / "two.raw")  # keeps a sixth of one's pack live
    ok(a, "image", "rm", "one")
    before = set(objects(s3_env, f"{s3_prefix}/a", "packs/"))
    p = cli(a, "gc", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["packs_repacked"] == 0  # (mostly dead, but b relies on it)
    assert before == set(objects(s3_env, f"{s3_prefix}/a", "packs/"))
    ok(b, "image", "rm", "one")
    gc(b)
    p = cli(a, "gc", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["packs_repacked"] >= 1  # now it may be
    ok(a, "image", "export", "two", tmp_path / "out.raw")
    assert (tmp_path / "out.raw").read_bytes() == data[:MiB] + bytes(MiB)
    fsck_clean(a)
    fsck_clean(b)


def test_two_hosts_one_bucket_over_ssh(
    pair: tuple[Path, Path], s3_env: Seaweed, tmp_path: Path, sshd: Sshd
) -> None:
    """The two-host setup of docs/s3.md: the source runs over real ssh (with the AWS
    settings its host would have), and still only records move."""
    a, b = pair
    block_volume(a, tmp_path, "vm1", 16 * MiB, os.urandom(6 * MiB))
    n = write_block(a, "vm1", [(10 * MiB, os.urandom(MiB))])
    settings = " ".join(f"{k}={v}" for k, v in s3_env.env().items())
    remote = sshd.remote.replace("env ", f"env {settings} ", 1)
    moved = pull(b, sshd.url(a), "vm1", "--remote-casfs", remote, CASFS_SSH=sshd.ssh)
    assert moved["n"] == n and moved["adopted"] == moved["blobs"] and int(moved["blobs"]) > 100
    assert int(moved["bytes"]) < 100_000
    assert exported(a, f"vm1@{n}", tmp_path / "a.img") == exported(b, f"vm1@{n}", tmp_path / "b.img")
    fsck_clean(a)
    fsck_clean(b)


def test_stale_references_are_reaped_and_old_pins_never_published(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A reference whose adopter is gone (old, its adopted object absent) is removed by
    the owner's gc; one a published adopted object names stays; and an adopter does
    not publish on a pin older than PIN_VALID_S (the owner may have reaped it)."""
    from casfs.errors import CasfsError

    a, b = pair
    (tmp_path / "one.raw").write_bytes(os.urandom(2 * MiB))
    ok(a, "image", "import", "one", tmp_path / "one.raw")
    ok(b, "image", "pull", a, "one")
    with contextlib.closing(Repository.open(b)) as repo_b, contextlib.closing(Repository.open(a)) as repo_a:
        sb, sa = repo_b.blobs, repo_a.blobs
        assert isinstance(sb, S3BlobStore) and isinstance(sa, S3BlobStore)
        (name,) = sa.table.names()
        f = Foreign(sa.loc.prefix, sa.loc.store_id, name)
        assert pins.pin(sb, f, "gone")  # an adopter that never published and never came back
        assert len(list(sa.remote.list(f"refs/{name}/"))) == 2
        assert not pins.may_remove(sa, name)  # young: both kept
        monkeypatch.setattr(pins, "STALE_AFTER_S", 0.0)
        assert not pins.may_remove(sa, name)  # the stale one reaped, b's real one kept
        (kept,) = [k for k, _ in sa.remote.list(f"refs/{name}/")]
        assert not kept.endswith(".gone")

        staging = sb.staging()
        assert staging.pin({f: sa.table.packs[name].size}) == set()
        bid, (offset, length) = next(iter(sa.table.packs[name].entries.items()))
        staging.adopt(bid, f, offset, length)
        monkeypatch.setattr(pins, "PIN_VALID_S", 0.0)
        with pytest.raises(CasfsError, match="too old"):
            staging.publish()
        staging.discard()
        assert [k for k, _ in sa.remote.list(f"refs/{name}/")] == [kept]
    ok(b, "image", "rm", "one")
    gc(b)
    with contextlib.closing(Repository.open(a)) as repo_a:
        sa = repo_a.blobs
        assert isinstance(sa, S3BlobStore)
        assert not list(sa.remote.list(f"refs/{name}/"))
    fsck_clean(a)
    fsck_clean(b)
