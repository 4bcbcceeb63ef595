"""A store whose blobs are in a bucket (`casfs init --blobs s3://…`), on a real SeaweedFS
server: the command line and real mounts work on it unchanged, and a wrong endpoint,
wrong credentials or a missing bucket stop `init` and `mount` with one line.

The AWS_* settings are this process's environment for the test (the CLI and the daemons
inherit them). Stores here are fsck'd by the tests themselves (`casfs fsck`), not by
the conftest's check, which runs after the environment is restored."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.cli import CLI, TIMEOUT, Completed, ok, out, run
from tests.helpers.cli import env as cli_env
from tests.helpers.mount import cleanup, mounted, start_daemon, wait_gone
from tests.helpers.seaweed import BUCKET, Seaweed

MIB = 1 << 20


@pytest.fixture
def s3_store(s3_env: Seaweed, s3_prefix: str, tmp_path: Path) -> Path:
    store = tmp_path / "store"
    done = ok(store, "init", "--blobs", f"s3://{BUCKET}/{s3_prefix}")
    assert "with blobs in s3://" in done.stdout
    return store


def casfs(store: Path, *args: str | Path, **env: str) -> Completed:
    """`casfs -s STORE ARGS` with `env` over this process's environment."""
    return run([*CLI, "-s", store, *args], timeout=TIMEOUT, env=cli_env(CASFS_TEST_TIMEOUTS="0", **env))


def _fsck_clean(store: Path) -> None:
    report = json.loads(out(store, "fsck", "--json"))
    assert report["clean"], report


def _objects(seaweed: Seaweed, prefix: str) -> dict[str, int]:
    import obstore

    return {o["path"]: o["size"] for page in obstore.list(seaweed.obstore(prefix)) for o in page}


def test_init_records_the_bucket_and_the_blobs_go_there(
    s3_store: Path, s3_env: Seaweed, s3_prefix: str, tmp_path: Path
) -> None:
    config = json.loads((s3_store / "blobs.json").read_text())
    assert config["url"] == f"s3://{BUCKET}/{s3_prefix}" and config["endpoint"] == s3_env.endpoint
    assert "secret" not in json.dumps(config).lower()
    src = tmp_path / "disk.raw"
    src.write_bytes(os.urandom(3 * MIB) + bytes(MIB) + b"tail" * 5000)
    ok(s3_store, "image", "import", "disk", src)
    assert not (s3_store / "blobs").exists()
    objects = _objects(s3_env, s3_prefix)
    packs = [k for k in objects if k.startswith("packs/")]
    assert packs and len([k for k in objects if k.startswith("index/")]) == len(packs)
    ok(s3_store, "image", "export", "disk", tmp_path / "out.raw")
    assert (tmp_path / "out.raw").read_bytes() == src.read_bytes()
    ok(s3_store, "init", "--blobs", f"s3://{BUCKET}/{s3_prefix}")  # idempotent
    again = casfs(s3_store, "init", "--blobs", f"s3://{BUCKET}/elsewhere")
    assert again.returncode == 4 and "not s3://casfs/elsewhere" in again.stderr
    _fsck_clean(s3_store)


@pytest.mark.parametrize(
    ("setting", "code", "says"),
    [
        ({"AWS_SECRET_ACCESS_KEY": "wrong"}, 1, "refused (SignatureDoesNotMatch)"),
        ({"AWS_ACCESS_KEY_ID": "nobody"}, 1, "refused"),
        ({"bucket": "no-such-bucket"}, 3, "bucket no-such-bucket does not exist"),
        (
            {"AWS_ENDPOINT_URL": "http://127.0.0.1:1"},
            1,
            "cannot reach the object store at http://127.0.0.1:1",
        ),
    ],
)
def test_a_wrong_setting_is_one_line_at_init_and_at_mount(
    s3_store: Path, s3_prefix: str, tmp_path: Path, setting: dict[str, str], code: int, says: str
) -> None:
    env = {k: v for k, v in setting.items() if k != "bucket"}
    bucket = setting.get("bucket", BUCKET)
    started = time.monotonic()
    done = casfs(tmp_path / "new", "init", "--blobs", f"s3://{bucket}/{s3_prefix}", **env)
    assert (done.returncode, done.stdout) == (code, "")
    assert says in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "new").exists()  # nothing written
    assert time.monotonic() - started < 30
    if "bucket" in setting:
        return
    ok(s3_store, "volume", "create", "v", "--blank-dir")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = casfs(s3_store, "mount", mnt, "--volume", "v", **env)
    assert done.returncode == code and says in done.stderr and done.stderr.count("\n") == 1, done.stderr
    done = casfs(s3_store, "image", "ls", **env)
    assert done.returncode == code and says in done.stderr


def test_dir_and_block_volumes_mount_snapshot_clone_survive_kill_9_and_gc(
    s3_store: Path, s3_env: Seaweed, s3_prefix: str, tmp_path: Path
) -> None:
    """The real-mount subset: an image in the bucket, a dir and a block volume written
    through mounts, snapshots and clones, a daemon killed with -9 and recovered, gc
    removing what nothing references, fsck clean all along."""
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "big").write_bytes(os.urandom(2 * MIB))
    (tree / "small").write_text("small file\n")
    os.symlink("sub/big", tree / "link")
    ok(s3_store, "image", "import", "base", tree)
    disk = tmp_path / "disk.raw"
    disk.write_bytes(os.urandom(MIB) + bytes(MIB))
    ok(s3_store, "image", "import", "disk", disk)
    ok(s3_store, "volume", "create", "d", "--from", "base")
    ok(s3_store, "volume", "create", "b", "--from", "disk")

    with mounted(s3_store, tmp_path / "mnt") as m:
        vol = m.path / "volumes" / "d"
        assert (vol / "sub" / "big").read_bytes() == (tree / "sub" / "big").read_bytes()
        (vol / "new").write_bytes(b"written through the mount" * 1000)
        os.unlink(vol / "small")
        block = m.path / "volumes" / "b"
        with open(block, "r+b") as f:
            f.seek(MIB + 4096)
            f.write(b"B" * 8192)
            os.fsync(f.fileno())
    ok(s3_store, "snapshot", "create", "d")
    ok(s3_store, "snapshot", "create", "b")
    ok(s3_store, "volume", "create", "d2", "--from", "d@1")
    ok(s3_store, "volume", "create", "b2", "--from", "b@1")
    expect_block = bytearray(disk.read_bytes())
    expect_block[MIB + 4096 : MIB + 4096 + 8192] = b"B" * 8192
    ok(s3_store, "volume", "export", "b2", tmp_path / "b2.raw")
    assert (tmp_path / "b2.raw").read_bytes() == bytes(expect_block)

    # kill -9 of a daemon with unsaved writes, then recovery by the next command
    mnt = tmp_path / "mnt2"
    mnt.mkdir()
    m = start_daemon(s3_store, mnt, volume="d2")
    try:
        (mnt / "after-kill").write_bytes(os.urandom(300_000))
        fd = os.open(mnt / "after-kill", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        os.kill(m.pid, signal.SIGKILL)
        assert wait_gone(m.pid, m.proc, 30)
    finally:
        cleanup(m.path, m.pid, m.proc)
    ok(s3_store, "snapshot", "create", "d2")
    ok(s3_store, "volume", "export", "d2", tmp_path / "d2")
    assert sorted(p.name for p in (tmp_path / "d2").iterdir()) == ["after-kill", "link", "new", "sub"]
    assert (tmp_path / "d2" / "new").read_bytes() == b"written through the mount" * 1000
    _fsck_clean(s3_store)

    before = _objects(s3_env, s3_prefix)
    for name in ("d2", "b2", "d", "b"):
        ok(s3_store, "volume", "rm", name)
    ok(s3_store, "image", "rm", "base")
    ok(s3_store, "image", "rm", "disk")
    ok(s3_store, "gc")
    after = _objects(s3_env, s3_prefix)
    assert sum(v for k, v in after.items() if k.startswith("packs/")) < sum(
        v for k, v in before.items() if k.startswith("packs/")
    )
    assert not [k for k in after if k.startswith("packs/")], after  # every pack was all dead
    _fsck_clean(s3_store)


def test_image_fetch_fills_an_empty_cache_with_every_blob_of_the_image(
    s3_env: Seaweed, s3_prefix: str, tmp_path: Path
) -> None:
    """A second host's view: the cache emptied, `casfs image fetch` reads it all back."""
    store = tmp_path / "store"
    ok(store, "init", "--blobs", f"s3://{BUCKET}/{s3_prefix}", "--blob-cache", "64M")
    assert json.loads((store / "blobs.json").read_text())["cache_bytes"] == 64 << 20
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    for i in range(5):
        (tree / "d" / f"f{i}").write_bytes(os.urandom(200_000 + i))
    ok(store, "image", "import", "img", tree)
    cache = store / "cache" / "blobs"
    shutil.rmtree(cache, ignore_errors=True)
    done = ok(store, "image", "fetch", "img")
    cached = {p.name for p in cache.rglob("*") if p.is_file()}
    assert f"image img: {len(cached)} blobs" in done.stdout
    ok(store, "volume", "create", "v", "--from", "img")
    ok(store, "volume", "export", "v", tmp_path / "out")
    assert all(
        (tmp_path / "out" / "d" / f"f{i}").read_bytes() == (tree / "d" / f"f{i}").read_bytes()
        for i in range(5)
    )
    missing = casfs(store, "image", "fetch", "nope")
    assert missing.returncode == 3
