"""kill -9 of a directory volume's daemon in the middle of random writes, through a
real mount: what fsync acknowledged is there after the next mount, and every 4 KiB
block of a file written since its fsync reads back its old or its new bytes (the
files' upper files, casfs.vfs.overlay.files). Several rounds on one volume, each with a
kill, then an unmount whose snapshot must hold the last state, and fsck clean.

CASFS_DIR_CRASH_SEED=N replays a failure (the seed is in the message),
CASFS_DIR_CRASH_ROUNDS=N runs longer."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

from casfs import volumes
from casfs.repo import Repository
from tests.helpers.cli import casfs
from tests.helpers.mount import fsync, mounted, running, wait_gone

BLOCK = 4096
SEED = int(os.environ.get("CASFS_DIR_CRASH_SEED", random.randrange(1 << 30)))
ROUNDS = int(os.environ.get("CASFS_DIR_CRASH_ROUNDS", "4"))
FILES = 6


def blocks(data: bytes) -> list[bytes]:
    return [data[i : i + BLOCK] for i in range(0, len(data), BLOCK)]


def test_kill_9_keeps_what_fsync_acknowledged(repo: Repository, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    mnt = tmp_path / "mnt"
    synced: dict[str, bytes] = {}  # what the last fsync of each file acknowledged
    for round_no in range(ROUNDS):
        since: dict[str, list[bytes]] = {}  # files written after their last fsync: each state since
        with running(repo.path, mnt, volume="v") as m:
            for name, want in synced.items():  # the last round's kill kept every fsync
                assert (mnt / name).read_bytes() == want, (SEED, round_no, name)
            for _ in range(rng.randrange(10, 40)):
                name = f"f{rng.randrange(FILES)}"
                path = mnt / name
                current = since[name][-1] if name in since else synced.get(name, b"")
                if rng.random() < 0.15 and current:
                    size = rng.randrange(len(current) + 1)
                    os.truncate(path, size)
                    new = current[:size]
                else:
                    offset = rng.randrange(0, len(current) + 3 * BLOCK + 1)
                    data = rng.randbytes(rng.randrange(1, 5 * BLOCK))
                    with open(path, "r+b" if path.exists() else "wb") as f:
                        f.seek(offset)
                        f.write(data)
                    grown = bytearray(current) + bytes(max(0, offset - len(current)))
                    grown[offset : offset + len(data)] = data
                    new = bytes(grown)
                since.setdefault(name, []).append(new)
                if rng.random() < 0.4:
                    fsync(path)
                    synced[name] = since.pop(name)[-1]
            os.kill(m.pid, signal.SIGKILL)
            assert wait_gone(m.pid, m.proc, 30)
        with running(repo.path, mnt, volume="v"):
            for name, states in since.items():
                old = synced.get(name)
                if not (mnt / name).exists():
                    assert old is None, (SEED, round_no, name)  # a file never fsynced may be gone
                    continue
                got = (mnt / name).read_bytes()
                # Unacknowledged: any size the file had since (a timer's flush may have
                # committed one), and each block as one of the states since held it.
                seen = ([] if old is None else [old]) + states
                assert len(got) in {len(s) for s in seen}, (SEED, round_no, name)
                for i, block in enumerate(blocks(got)):
                    choices = {blocks(s.ljust(len(got), b"\0")[: len(got)])[i] for s in seen}
                    assert block in choices, (SEED, round_no, name, i)
                fsync(mnt / name)
                synced[name] = got  # what this mount holds now: the next round's reference
    with mounted(repo.path, mnt, volume="v") as m:
        for name, want in synced.items():
            assert (m.path / name).read_bytes() == want, (SEED, name)
    out = tmp_path / "out"
    done = casfs(repo.path, "volume", "export", "v", str(out))
    assert done.returncode == 0, done.stderr
    for name, want in synced.items():
        assert (out / name).read_bytes() == want, (SEED, name)
