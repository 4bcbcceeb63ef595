"""The bounded work queue, across real processes: 20 imports started at once with a
limit of 2 all finish, never more than 2 at a time, with the waiting ones visible
(`casfs queue ls`, phase queued in `casfs image ls`) while they wait."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from casfs.lifecycle import queue
from casfs.repo import Repository
from tests.helpers.cli import CLI, env, js, ok
from tests.helpers.fsck import assert_consistent

JOBS = 20
LIMIT = 2


def max_running(log: list[str]) -> int:
    """The most jobs between their start and end lines at once (lines are in real order)."""
    running = peak = 0
    for line in log:
        running += 1 if line.startswith("start ") else -1
        peak = max(peak, running)
    return peak


def test_twenty_imports_two_at_a_time(store: Path, tmp_path: Path) -> None:
    ok(store, "config", "set", "queue.limit", str(LIMIT))
    sources = []
    for i in range(JOBS):
        sources.append(tmp_path / f"src{i}.raw")
        sources[-1].write_bytes(os.urandom(256 << 10))
    log = tmp_path / "jobs.log"
    # Each job holds its slot a second: long enough that, however slowly twenty Python
    # processes start on a loaded machine, some are seen waiting while two run.
    job_env = env(CASFS_JOB_LOG=str(log), CASFS_SLOW_IMPORT_S="1.0")
    procs = [
        subprocess.Popen(
            [*CLI, "-s", str(store), "image", "import", f"img{i}", str(src)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=job_env,
        )
        for i, src in enumerate(sources)
    ]
    seen_waiting = seen_queued = False
    try:
        while any(p.poll() is None for p in procs):
            status = js(store, "queue", "ls")
            assert status["limit"] == LIMIT
            assert len(status["running"]) <= LIMIT
            assert all(j["what"].startswith("import img") for j in status["running"] + status["waiting"])
            seen_waiting |= len(status["running"]) == LIMIT and bool(status["waiting"])
            seen_queued |= "queued" in {i["phase"] for i in js(store, "image", "ls")}
            time.sleep(0.1)
        for p in procs:
            assert p.wait() == 0, p.stderr.read() if p.stderr else ""
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stderr:
                p.stderr.close()
    assert seen_waiting and seen_queued, "progress was visible while jobs waited"
    lines = log.read_text().splitlines()
    assert sorted(lines) == sorted(
        [f"start {p.pid} import img{i}" for i, p in enumerate(procs)]
        + [f"end {p.pid} import img{i}" for i, p in enumerate(procs)]
    )
    assert max_running(lines) == LIMIT
    assert {i["phase"] for i in js(store, "image", "ls")} == {"ready"}
    assert js(store, "queue", "ls") == {"limit": LIMIT, "running": [], "waiting": []}
    assert_consistent(store)


def test_slots_nest_and_free_on_kill(repo: Repository, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread holding a slot runs nested jobs in it; a killed holder frees its slot."""
    monkeypatch.setenv("CASFS_QUEUE_LIMIT", "1")
    with queue.job_slot(repo, "outer") as outer, queue.job_slot(repo, "inner") as inner:
        assert outer == inner == 0
        (job,) = queue.status(repo).running
        assert (job.pid, job.what, job.slot) == (os.getpid(), "outer", 0)
    holder = subprocess.Popen(
        [
            *CLI[:1],
            "-c",
            "import sys, time\n"
            "from casfs.repo import Repository\n"
            "from casfs.lifecycle.queue import job_slot\n"
            "with job_slot(Repository.open(sys.argv[1]), 'held'):\n"
            "    print('in', flush=True); time.sleep(60)",
            str(repo.path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env(CASFS_QUEUE_LIMIT="1"),
    )
    try:
        assert holder.stdout and holder.stdout.readline() == "in\n"
        assert [j.what for j in queue.status(repo).running] == ["held"]
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout:
            holder.stdout.close()
    assert queue.status(repo).running == []  # its content names a dead pid
    start = time.monotonic()
    with queue.job_slot(repo, "after") as slot:
        assert slot == 0 and time.monotonic() - start < 1.0
