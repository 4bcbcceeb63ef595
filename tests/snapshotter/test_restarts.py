"""kill -9 of the snapshotter and of containerd, mid-run and mid-unpack: after restarts
every snapshot is consistent, nothing half-applied is committed, running containers keep
their rootfs, and the store is fsck clean (conftest's stack, one for this module, checks
it at the end)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess

from tests.helpers.procs import stopped
from tests.snapshotter.build import HELLO
from tests.snapshotter.conftest import Image
from tests.snapshotter.stack import REF, Stack

IMPORT = ("images", "import", "--snapshotter", "casfs", "--base-name", "example.com/bb")


def stale_connection(out: str, s: Stack) -> bool:
    """Whether an import failed on containerd's connection to a snapshotter restarted just
    before (gRPC Unavailable while the new one lives: seen once in a while on the first
    call after a restart), not on the snapshotter's fault point."""
    return "unavailable" in out and s.snap is not None and s.snap.poll() is None


def stopped_or_ended(pid: int, proc: subprocess.Popen[str]) -> bool:
    return stopped(pid) or proc.poll() is not None


def import_into(s: Stack, image: Image, namespace: str) -> str:
    for _ in range(3):
        out = s.ctr(*IMPORT, str(image.tar), namespace=namespace, check=False)
        if not stale_connection(out, s):
            break
        s.wait_reconnected()
    return out


def settled(s: Stack) -> None:
    """No snapshot is in the middle of an operation, once what is under way (a `ctr run
    --rm`'s Remove may still be running when ctr returns) has finished: one left stuck
    by a crash never settles."""
    s.wait("every snapshot settled", lambda: all(r["phase"] == "ready" for r in s.records().values()))


def committed_in(s: Stack, namespace: str) -> list[str]:
    return sorted(k for k, kind in s.snapshots(namespace).items() if kind == "Committed")


def test_running_containers_keep_their_rootfs_across_restarts(stack: Stack, image: Image) -> None:
    s = stack
    assert "done" in import_into(s, image, "default")
    s.ctr("run", "-d", "--snapshotter", "casfs", REF, "runner", "/bin/sleep", "1000")
    try:
        s.ctr("tasks", "exec", "--exec-id", "w1", "runner", "/bin/sh", "-c", "echo before > /data/f")
        s.kill9_snapshotter()
        # the container's rootfs is its own daemon's: it reads and writes without the snapshotter
        out = s.ctr(
            "tasks",
            "exec",
            "--exec-id",
            "w2",
            "runner",
            "/bin/sh",
            "-c",
            "cat /data/f; echo during >> /data/f",
        )
        assert out == "before\n"
        s.start_snapshotter()
        s.kill9_containerd()
        s.start_containerd()
        assert s.task_status("runner") == "RUNNING"  # (its shim outlived containerd)
        out = s.ctr("tasks", "exec", "--exec-id", "r", "runner", "/bin/cat", "/data/f", "/etc/hello.txt")
        assert out == f"before\nduring\n{HELLO}"
        assert s.snapshots()["runner"] == "Active"
        settled(s)
    finally:
        s.end("runner")
    s.gc()
    s.wait("runner's snapshot removed", lambda: "runner" not in s.snapshots())


def test_a_snapshotter_killed_mid_prepare_or_mid_commit_leaves_nothing_half_made(
    stack: Stack, image: Image
) -> None:
    s = stack
    for fault, namespace in (
        ("snapshotter:prepared", "crash-prepare"),
        ("snapshotter:committing", "crash-commit"),
    ):
        s.kill9_snapshotter()
        s.start_snapshotter(fault=fault)
        s.wait_reconnected()
        out = import_into(s, image, namespace)
        assert "done" not in out, out  # (the unpack failed: the snapshotter died under it)
        died = lambda: s.snap is not None and s.snap.poll() is not None  # noqa: E731
        s.wait(f"the snapshotter killed itself (ctr said: {out[-1000:]})", died)
        s.snap = None
        s.start_snapshotter()  # (recovers: a prepare undone, a commit back to active)
        settled(s)
        s.wait_reconnected()
        assert committed_in(s, namespace) == []  # nothing half-applied is committed
        assert "done" in import_into(s, image, namespace)  # (again: containerd unpacks anew)
        assert len(committed_in(s, namespace)) == 2
        assert (
            s.ctr("run", "--rm", "--snapshotter", "casfs", REF, f"after-{fault[12:]}", namespace=namespace)
            == HELLO
        )
    s.gc("crash-prepare")
    s.gc("crash-commit")


def test_containerd_killed_mid_unpack(stack: Stack, image: Image) -> None:
    s = stack
    # The snapshotter stops itself in the unpack's first Prepare, so that containerd dies
    # with its unpack surely unfinished (a fast one unpacked both layers before a kill
    # that followed the Prepare's log line).
    s.stop_snapshotter()
    s.start_snapshotter(stop="snapshotter:prepared")
    s.wait_reconnected()
    snap = s.snap
    assert snap is not None
    for _ in range(3):
        proc = s.ctr_popen(*IMPORT, str(image.tar), namespace="crash-ctrd")
        s.wait("the snapshotter stopped in a Prepare", functools.partial(stopped_or_ended, snap.pid, proc))
        if stopped(snap.pid):
            break
        said = proc.communicate(timeout=60)[0]  # (it ended first: a stale connection, retried)
        assert stale_connection(said, s), said
    s.kill9_containerd()
    proc.communicate(timeout=60)  # (it fails: containerd is gone)
    os.kill(snap.pid, signal.SIGCONT)  # (its Prepare ends, answered to no one)
    assert s.stop_snapshotter() == 0
    s.start_snapshotter()
    s.start_containerd()
    s.wait_reconnected()
    # what the killed import left is not committed (an active snapshot, leased by it)
    assert committed_in(s, "crash-ctrd") == []
    assert "done" in import_into(s, image, "crash-ctrd")
    assert len(committed_in(s, "crash-ctrd")) == 2
    assert s.ctr("run", "--rm", "--snapshotter", "casfs", REF, "after-ctrd", namespace="crash-ctrd") == HELLO
    settled(s)
