"""One owner per catalog connection: threads never share one.

A flush commits in a worker thread while the event loop claims volumes and answers
control getters; when they shared one connection, their transactions interleaved
("cannot start a transaction within a transaction", reads of uncommitted rows), and
an fsync could fail with EIO. Each thread now has its own (Repository.conn), and a
connection used by another thread refuses at once.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

from casfs import volumes
from casfs.catalog import transaction
from casfs.repo import Repository
from tests.helpers.cli import casfs
from tests.helpers.mount import mounted


def test_threads_writing_through_one_repository_each_get_their_own_transactions(repo: Repository) -> None:
    errors: list[BaseException] = []

    def writer(tag: str) -> None:
        try:
            for i in range(200):
                with transaction(repo.conn) as conn:
                    conn.execute("INSERT INTO meta VALUES (?, ?)", (f"test.{tag}.{i}", "x"))
                    # a reader on this thread sees its own row, never the other thread's half
                    seen = conn.execute("SELECT count(*) FROM meta WHERE key LIKE ?", (f"test.{tag}.%",))
                    assert seen.fetchone()[0] == i + 1
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert repo.conn.execute("SELECT count(*) FROM meta WHERE key LIKE 'test.%'").fetchone()[0] == 400


def test_a_connection_refuses_other_threads(store: Path) -> None:
    repo = Repository.open(store)
    mine = repo.conn
    failed: list[BaseException] = []

    def borrow() -> None:
        try:
            mine.execute("SELECT 1")
        except sqlite3.ProgrammingError as e:
            failed.append(e)
        assert repo.conn is not mine  # this thread gets its own

    t = threading.Thread(target=borrow)
    t.start()
    t.join()
    assert len(failed) == 1 and "used by thread" in str(failed[0])
    repo.close()  # closes the other thread's connection too


WRITER = """
import os, sys
top, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    with open(os.path.join(top, f"f{i}"), "wb") as f:
        f.write(os.urandom(20000 + i))
        f.flush()
        os.fsync(f.fileno())
"""


def test_two_volumes_flushing_and_snapshotting_at_once_in_one_mount(store: Path, tmp_path: Path) -> None:
    with contextlib.closing(Repository.open(store)) as repo:
        volumes.create_volume(repo, "a", volumes.Source(blank_dir=True))
        volumes.create_volume(repo, "b", volumes.Source(blank_dir=True))
        volumes.create_volume(repo, "disk", volumes.Source(blank_block=8 << 20))
    n = 40
    with mounted(store, tmp_path / "mnt") as m:
        writers = [
            subprocess.Popen([sys.executable, "-c", WRITER, str(m.path / "volumes" / v), str(n)])
            for v in ("a", "b")
        ]
        disk = m.path / "volumes" / "disk"
        writers.append(
            subprocess.Popen(
                ["dd", "if=/dev/urandom", f"of={disk}", "bs=64k", "count=64", "oflag=dsync", "conv=notrunc"],
                stderr=subprocess.DEVNULL,
            )
        )
        try:
            for i in range(6):
                for v in ("a", "b", "disk"):
                    done = subprocess.run(
                        ["setfattr", "-n", "user.casfs.snapshot", "-v", f"s{i}", str(m.path / "volumes" / v)],
                        capture_output=True,
                        text=True,
                        timeout=120,
                    )
                    assert done.returncode == 0, done.stderr
            assert [w.wait(timeout=120) for w in writers] == [0, 0, 0]
        finally:
            for w in writers:  # (a failed test must not leave them holding the mount)
                if w.poll() is None:
                    w.kill()
                    w.wait()
        sizes = {v: sorted(p.stat().st_size for p in (m.path / "volumes" / v).iterdir()) for v in ("a", "b")}
    assert sizes == {v: [20000 + i for i in range(n)] for v in ("a", "b")}
    with mounted(store, tmp_path / "mnt") as m:
        for v in ("a", "b"):
            assert sorted(p.stat().st_size for p in (m.path / "volumes" / v).iterdir()) == sizes[v]
    assert "error" not in casfs(store, "volume", "ls").stderr
    with contextlib.closing(Repository.open(store)) as repo:
        assert len(volumes.list_snapshots(repo, "a")) >= 6
