"""Two stores on this machine and what moves between them: volumes made and written
in-process (casfs.vfs, no mount), and the real CLI in subprocesses for the transfers."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from casfs import images, volumes
from casfs.ids import ROOT_INO, SnapshotNo
from casfs.kinds import BlobKind
from casfs.replica.walk import reachable
from casfs.repo import Repository
from casfs.store.ids import BlobId
from casfs.vfs.volume import open_volume
from tests.helpers.cli import CLI, TIMEOUT, env
from tests.helpers.fsck import query

MiB = 1 << 20
CHUNK = 64 << 10


def cli(
    store: Path, *args: str | Path, stdin: bytes | None = None, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`casfs -s STORE ARGS` with bytes in and out (`extra`: more environment)."""
    return subprocess.run(
        [*CLI, "-s", str(store), *map(str, args)],
        input=stdin,
        capture_output=True,
        timeout=TIMEOUT,
        env=env(CASFS_TEST_TIMEOUTS="0", **(extra or {})),
    )


def send(store: Path, ref: str, since: str | None = None) -> bytes:
    p = cli(store, "snapshot", "send", ref, *(["--since", since] if since else []))
    assert p.returncode == 0, p.stderr
    return p.stdout


def receive(store: Path, stream: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    return cli(store, "snapshot", "receive", *args, stdin=stream)


def block_volume(store: Path, tmp_path: Path, name: str, size: int, data: bytes) -> None:
    """Volume `name` of `size` bytes starting with `data`, from an image of that."""
    src = tmp_path / f"{name}.img"
    with open(src, "wb") as f:
        f.write(data)
        f.truncate(size)
    with contextlib.closing(Repository.open(store)) as repo:
        images.import_image(repo, f"{name}-image", src)
        volumes.create_volume(repo, name, volumes.Source(image=f"{name}-image"))


def write_block(store: Path, name: str, writes: Sequence[tuple[int, bytes]]) -> SnapshotNo:
    """Write into a block volume as its mount would, then unmount: its new snapshot."""
    with contextlib.closing(Repository.open(store)) as repo:
        v = open_volume(repo, name)
        for offset, data in writes:
            v.write_sync(ROOT_INO, offset, data)
        n = v.close()
    assert n is not None
    return n


def snapshot(store: Path, name: str) -> SnapshotNo:
    with contextlib.closing(Repository.open(store)) as repo:
        return volumes.create_snapshot(repo, name)


def root_of(store: Path, ref: str) -> str:
    vol, _, n = ref.partition("@")
    rows = query(store, "SELECT root FROM snapshots WHERE volume = ? AND n = ?", vol, int(n))
    return bytes(rows[0][0]).hex() if rows else ""


def new_data_bytes(store: Path, ref: str, since: str, kind: BlobKind) -> int:
    """Stored bytes of the data blobs under `ref` and not under `since`: what changed."""
    with contextlib.closing(Repository.open(store)) as repo:
        new, old = (
            reachable(repo.get_meta, BlobId(bytes.fromhex(root_of(store, r))), kind) for r in (ref, since)
        )
        ids = [
            b
            for b in new - old
            if repo.conn.execute("SELECT kind FROM blobs WHERE id = ?", (b,)).fetchone()[0] == 0
        ]
        return sum(repo.blobs.stored_size(b) for b in ids)


def visible(store: Path) -> list[tuple[object, ...]]:
    """What a transfer may change that users see: volumes and snapshots."""
    return query(store, "SELECT name, base, next_snapshot FROM volumes ORDER BY name") + query(
        store, "SELECT volume, n, root FROM snapshots ORDER BY volume, n"
    )


def exported(store: Path, ref: str, dest: Path) -> bytes:
    p = cli(store, "snapshot", "export", ref, dest)
    assert p.returncode == 0, p.stderr
    return dest.read_bytes() if dest.is_file() else b""


def random_writes(seed: int, size: int, total: int, piece: int = CHUNK) -> list[tuple[int, bytes]]:
    """`total` bytes of random data in `piece`-sized writes at chunk-aligned offsets."""
    import random

    rnd = random.Random(seed)
    offsets = rnd.sample(range(0, size // piece), total // piece)
    return [(o * piece, os.urandom(piece)) for o in sorted(offsets)]
