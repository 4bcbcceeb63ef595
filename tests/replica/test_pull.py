"""`casfs pull` between two stores: through a store path and through real ssh; killed
(SIGKILL) at random points of the transfer on either side, then run again."""

from __future__ import annotations

import contextlib
import json
import os
import random
from pathlib import Path

import pytest

from casfs.catalog import blobs as blob_rows
from casfs.kinds import BlobKind
from casfs.replica.walk import reachable
from casfs.replica.wire import RECORD
from casfs.repo import Repository
from casfs.store.ids import BlobId
from tests.api.test_roundtrip import make_tree
from tests.helpers.fsck import fsck_clean
from tests.helpers.trees import compare
from tests.replica.conftest import Sshd
from tests.replica.helpers import MiB, block_volume, cli, exported, root_of, visible, write_block

KILLS = int(os.environ.get("CASFS_REPLICA_KILLS", "3"))  # the issue asks 20 of each
FRAMING = RECORD.size + 6  # per blob on the wire, besides its encoded bytes


def pull(store: Path, source: str, *args: str, **env: str) -> dict[str, object]:
    p = cli(store, "pull", source, *args, "--json", extra=env)
    assert p.returncode == 0, p.stderr
    doc: dict[str, object] = json.loads(p.stdout)
    return doc


def test_pull_from_a_path_then_only_the_next_snapshot(two: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two
    block_volume(a, tmp_path, "vm1", 16 * MiB, os.urandom(4 * MiB))
    write_block(a, "vm1", [(8 * MiB, os.urandom(MiB))])
    first = pull(b, str(a), "vm1")
    assert (first["n"], first["plan"]) == (1, "new")
    n = write_block(a, "vm1", [(0, os.urandom(256 << 10))])
    second = pull(b, str(a), "vm1")
    assert (second["n"], second["plan"]) == (n, "next")
    assert int(str(second["bytes"])) < (256 << 10) * 1.2 + 200_000  # the change and the map
    assert root_of(b, f"vm1@{n}") == root_of(a, f"vm1@{n}")
    assert exported(a, f"vm1@{n}", tmp_path / "a.img") == exported(b, f"vm1@{n}", tmp_path / "b.img")
    assert pull(b, str(a), "vm1")["plan"] == "have"
    assert pull(b, str(a), "vm1", "--snapshot", "1", "--as", "old")["plan"] == "new"


def test_pull_over_ssh(two: tuple[Path, Path], tmp_path: Path, sshd: Sshd) -> None:
    a, b = two
    make_tree(tmp_path / "src")
    assert cli(a, "image", "import", "tree", tmp_path / "src").returncode == 0
    assert cli(a, "volume", "create", "ct", "--from", "tree").returncode == 0
    assert cli(a, "snapshot", "create", "ct").returncode == 0
    doc = pull(b, sshd.url(a), "ct", "--remote-casfs", sshd.remote, CASFS_SSH=sshd.ssh)
    assert doc["plan"] == "new"
    exported(a, "ct@1", tmp_path / "out-a")
    exported(b, "ct@1", tmp_path / "out-b")
    assert compare(tmp_path / "out-a", tmp_path / "out-b") == []
    p = cli(
        b,
        "pull",
        sshd.url(tmp_path / "nothing"),
        "ct",
        "--remote-casfs",
        sshd.remote,
        extra={"CASFS_SSH": sshd.ssh},
    )
    assert p.returncode == 3 and b"no casfs store" in p.stderr


def missing_on_the_wire(a: Path, b: Path, ref: str) -> int:
    """Bytes a pull of `ref` from a to b must still move: the blobs with no row in b."""
    root = BlobId(bytes.fromhex(root_of(a, ref)))
    with contextlib.closing(Repository.open(a)) as ra, contextlib.closing(Repository.open(b)) as rb:
        ids = list(reachable(ra.get_meta, root, BlobKind.MAP_ROOT))
        have = {bytes(x) for part in blob_rows.batches(ids) for x in blob_rows.known(rb.conn, part)}
        return sum(ra.blobs.stored_size(i) + FRAMING for i in ids if i not in have)


@pytest.mark.parametrize("role", ["receiver", "sender"])
def test_killed_pulls_finish_when_run_again(two: tuple[Path, Path], tmp_path: Path, role: str) -> None:
    a, b = two
    block_volume(a, tmp_path, "vm1", 32 * MiB, os.urandom(6 * MiB))
    n = write_block(a, "vm1", [(20 * MiB, os.urandom(2 * MiB))])
    ref = f"vm1@{n}"
    rnd = random.Random(f"{role}-{KILLS}")
    batch = str(MiB)
    for i in range(KILLS):
        before = visible(b)
        at = rnd.randrange(1, missing_on_the_wire(a, b, ref))
        p = cli(
            b,
            "pull",
            str(a),
            "vm1",
            extra={"CASFS_KILL_AFTER_BYTES": f"{role}:{at}", "CASFS_REPLICA_BATCH_BYTES": batch},
        )
        assert p.returncode != 0, (i, at)
        assert visible(b) == before  # nothing partial is visible
        missing = missing_on_the_wire(a, b, ref)
        if i % 2:
            continue  # killed again with this still missing
        doc = pull(b, str(a), "vm1", CASFS_REPLICA_BATCH_BYTES=batch)
        assert doc["plan"] == "new"
        assert int(str(doc["bytes"])) <= missing + 4096, (at, missing, doc)
        fsck_clean(a)
        fsck_clean(b)
        assert exported(a, ref, tmp_path / f"a{i}.img") == exported(b, ref, tmp_path / f"b{i}.img")
        assert cli(b, "volume", "rm", "vm1").returncode == 0
        assert cli(b, "gc").returncode == 0


def test_image_pull_copies_between_stores_that_keep_their_blobs(
    two: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two
    make_tree(tmp_path / "src")
    assert cli(a, "image", "import", "tree", tmp_path / "src").returncode == 0
    p = cli(b, "image", "pull", str(a), "tree", "--as", "copy", "--json")
    assert p.returncode == 0, p.stderr
    moved = json.loads(p.stdout)
    assert moved["plan"] == "new" and moved["adopted"] == 0 and moved["blobs"] > 0
    assert cli(b, "image", "pull", str(a), "tree", "--as", "copy").stdout.startswith(
        b"already have image copy"
    )
    assert cli(b, "image", "export", "copy", tmp_path / "out").returncode == 0
    assert compare(tmp_path / "src", tmp_path / "out", ignore={"atime"}) == []
    assert cli(b, "image", "pull", str(a), "nothing").returncode == 3
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "f").write_text("other")
    assert cli(a, "image", "import", "other", tmp_path / "other").returncode == 0
    assert cli(b, "image", "pull", str(a), "other", "--as", "copy").returncode == 4
