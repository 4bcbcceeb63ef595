"""Idempotency across kill -9 of the plugin, and concurrent RPCs for one volume.

kubelet and the sidecars retry whatever did not answer: after a restart of the plugin
each repeat must be answered as the first call was, from what the catalog, the run files
and the kernel's mount table say (the plugin keeps nothing in memory that matters)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from casfs.csi.proto import csi_pb2 as pb
from casfs.fuse.mountinfo import mounts
from tests.helpers.csi import (
    Plugin,
    block_cap,
    create,
    from_snapshot,
    from_volume,
    mount_cap,
    publish,
    snapshot,
    stage,
    unpublish,
    unstage,
)

DATA = b"survives restarts\n".ljust(4096, b".")


@pytest.mark.parametrize("kind", ["dir", "block"])
def test_kill_9_between_any_two_steps_and_a_new_plugin_finishes_the_flow(
    plugin: Plugin, kubelet: Path, kind: str
) -> None:
    """After every step: kill -9, start a new plugin, repeat the step (it must succeed
    and change nothing), go on. (A block volume's data is written to its device.)"""
    cap = mount_cap() if kind == "dir" else block_cap()
    staging, target = kubelet / "staging" / "v", kubelet / "pods" / "a" / "v"
    staging2, target2 = kubelet / "staging" / "v2", kubelet / "pods" / "b" / "v"
    seen: dict[str, object] = {}

    def write() -> None:
        path = target / "f.txt" if kind == "dir" else target
        with open(path, "r+b" if kind == "block" else "wb") as f:
            f.write(DATA)
            f.flush()
            os.fsync(f.fileno())

    def read() -> None:
        with open(target2 / "f.txt" if kind == "dir" else target2, "rb") as f:
            assert f.read(len(DATA)) == DATA

    def snap() -> None:
        seen["snap"] = snapshot(plugin, "v", "s1").snapshot_id

    def clone() -> None:
        vol = create(plugin, "v2", cap, volume_content_source=from_snapshot(str(seen["snap"])))
        assert seen.setdefault("clone", vol) == vol

    steps: list[tuple[str, Callable[[], object]]] = [
        ("create", lambda: create(plugin, "v", cap, 16 << 20 if kind == "block" else 0)),
        ("stage", lambda: stage(plugin, "v", staging, cap)),
        ("publish", lambda: publish(plugin, "v", staging, target, cap)),
        ("write", write),
        ("unpublish", lambda: unpublish(plugin, "v", target)),
        ("unstage", lambda: unstage(plugin, "v", staging)),
        ("snapshot", snap),
        ("clone", clone),
        ("stage2", lambda: stage(plugin, "v2", staging2, cap)),
        ("publish2", lambda: publish(plugin, "v2", staging2, target2, cap)),
        ("read", read),
        ("unpublish2", lambda: unpublish(plugin, "v2", target2)),
        ("unstage2", lambda: unstage(plugin, "v2", staging2)),
        ("delete2", lambda: plugin.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id="v2"))),
        (
            "unsnap",
            lambda: plugin.controller.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=str(seen["snap"]))),
        ),
        ("delete", lambda: plugin.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id="v"))),
    ]
    for name, step in steps:
        step()
        table = _mounts_under(kubelet)
        plugin.kill9()
        plugin.start()
        step()  # the repeat, answered by a plugin that never saw the first call
        assert _mounts_under(kubelet) == table, f"the repeat of {name} changed mounts"
    assert plugin.controller.ListVolumes(pb.ListVolumesRequest()).entries == []


def test_a_block_volume_stays_staged_and_published_across_a_kill_9(plugin: Plugin, kubelet: Path) -> None:
    cap = block_cap()
    vol = create(plugin, "b", cap, 16 << 20)
    staging, device = kubelet / "staging" / "b", kubelet / "pods" / "a" / "dev"
    stage(plugin, vol.volume_id, staging, cap)
    publish(plugin, vol.volume_id, staging, device, cap)
    with open(device, "r+b") as f:
        f.write(b"x" * 4096)
    plugin.kill9()
    plugin.start()
    publish(plugin, vol.volume_id, staging, device, cap)
    with open(device, "rb") as f:
        assert f.read(4096) == b"x" * 4096
    unpublish(plugin, vol.volume_id, device)
    unstage(plugin, vol.volume_id, staging)


def _mounts_under(base: Path) -> list[tuple[str, str]]:
    return sorted((m.mountpoint, m.options) for m in mounts() if m.mountpoint.startswith(f"{base}/"))


def _concurrently(n: int, call: Callable[[], object]) -> list[object]:
    results: list[object] = [None] * n
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = call()
        except grpc.RpcError as e:
            results[i] = e.code()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def test_twenty_concurrent_creates_of_one_name_make_one_volume(plugin: Plugin) -> None:
    results = _concurrently(20, lambda: create(plugin, "one", mount_cap()))
    volumes = [r for r in results if isinstance(r, pb.Volume)]
    assert volumes and all(v == volumes[0] for v in volumes)
    assert all(isinstance(r, pb.Volume) or r == grpc.StatusCode.ABORTED for r in results), results
    listed = plugin.controller.ListVolumes(pb.ListVolumesRequest()).entries
    assert [e.volume.volume_id for e in listed] == ["one"]
    assert create(plugin, "one", mount_cap()) == volumes[0]


def test_twenty_concurrent_clones_of_one_volume_make_one_clone(plugin: Plugin) -> None:
    create(plugin, "src", mount_cap())
    results = _concurrently(
        20, lambda: create(plugin, "copy", mount_cap(), volume_content_source=from_volume("src"))
    )
    assert all(isinstance(r, pb.Volume) or r == grpc.StatusCode.ABORTED for r in results), results
    snaps = plugin.controller.ListSnapshots(pb.ListSnapshotsRequest(source_volume_id="src")).entries
    assert len(snaps) == 1  # (the one snapshot the clone was made through)
    plugin.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id="copy"))
    assert plugin.controller.ListSnapshots(pb.ListSnapshotsRequest(source_volume_id="src")).entries == []


def test_publish_racing_unpublish_leaves_one_consistent_state(plugin: Plugin, kubelet: Path) -> None:
    cap = mount_cap()
    create(plugin, "race", cap)
    staging, target = kubelet / "staging" / "race", kubelet / "pods" / "a" / "race"
    stage(plugin, "race", staging, cap)
    codes: list[grpc.StatusCode] = []

    def loop(call: Callable[[], object]) -> None:
        for _ in range(15):
            try:
                call()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                codes.append(e.code())

    threads = [
        threading.Thread(target=loop, args=(lambda: publish(plugin, "race", staging, target, cap),)),
        threading.Thread(target=loop, args=(lambda: unpublish(plugin, "race", target),)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.ABORTED}, codes
    binds = [m for m in mounts() if m.mountpoint == str(target)]
    assert len(binds) <= 1  # published once or not at all, never stacked
    unpublish(plugin, "race", target)
    assert not target.exists() and not [m for m in mounts() if m.mountpoint == str(target)]
    unstage(plugin, "race", staging)


def test_a_staged_volume_whose_daemon_died_is_staged_again(
    plugin: Plugin, store: Path, kubelet: Path
) -> None:
    """kill -9 of the mount daemon (as a restart of the plugin's container does): the
    dead mount is detached and the volume mounted again, with what fsync acknowledged."""
    import json
    import os
    import signal

    from casfs.fuse.launcher import run_path
    from tests.helpers.mount import wait_gone

    cap = mount_cap()
    create(plugin, "v", cap)
    staging, target = kubelet / "staging" / "v", kubelet / "pods" / "a" / "v"
    stage(plugin, "v", staging, cap)
    publish(plugin, "v", staging, target, cap)
    with open(target / "kept.txt", "w") as f:
        f.write("acknowledged\n")
        f.flush()
        os.fsync(f.fileno())
    pid = json.loads(run_path(store, str(staging)).read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid, None, 30)
    unpublish(plugin, "v", target)  # (the bind of a dead mount unmounts as any other)
    stage(plugin, "v", staging, cap)
    publish(plugin, "v", staging, target, cap)
    assert (target / "kept.txt").read_text() == "acknowledged\n"
    unpublish(plugin, "v", target)
    unstage(plugin, "v", staging)


def test_a_staged_volume_whose_daemon_died_unstages(plugin: Plugin, store: Path, kubelet: Path) -> None:
    import json
    import os
    import signal

    from casfs.fuse.launcher import run_path
    from tests.helpers.mount import is_mounted, wait_gone

    create(plugin, "v", mount_cap())
    staging = kubelet / "staging" / "v"
    stage(plugin, "v", staging, mount_cap())
    pid = json.loads(run_path(store, str(staging)).read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid, None, 30)
    unstage(plugin, "v", staging)
    assert not is_mounted(staging)
    unstage(plugin, "v", staging)
    plugin.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id="v"))  # (its phase recovered)
