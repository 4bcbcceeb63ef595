"""Each status code the plugin answers, met through the socket, with casfs's one-line
message: what a CSI sidecar retries on (ABORTED), gives up on (INVALID_ARGUMENT,
ALREADY_EXISTS, OUT_OF_RANGE) or waits for (FAILED_PRECONDITION, RESOURCE_EXHAUSTED)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from casfs.csi.proto import csi_pb2 as pb
from casfs.kinds import MAX_BLOCK_SIZE
from casfs.repo import Repository
from tests.helpers.csi import (
    Plugin,
    block_cap,
    create,
    from_snapshot,
    mount_cap,
    plugin_running,
    publish,
    snapshot,
    stage,
    unpublish,
    unstage,
)
from tests.helpers.fsck import Stores
from tests.helpers.mount import kernel_mounted
from tests.helpers.procs import wait_stopped

Code = grpc.StatusCode


def refused(call: Callable[[Any], object], request: object) -> tuple[grpc.StatusCode, str]:
    """The code and message of a call that must fail."""
    with pytest.raises(grpc.RpcError) as e:
        call(request)
    why = e.value.details() or ""
    assert why and "\n" not in why, "every refusal says why, in one line"
    return e.value.code(), why


def test_invalid_argument_for_missing_or_malformed_arguments(plugin: Plugin) -> None:
    c = plugin.controller
    assert refused(c.CreateVolume, pb.CreateVolumeRequest(volume_capabilities=[mount_cap()]))[0] == (
        Code.INVALID_ARGUMENT
    )
    code, why = refused(
        c.CreateVolume,
        pb.CreateVolumeRequest(name="v", volume_capabilities=[mount_cap()], parameters={"size": "1"}),
    )
    assert code == Code.INVALID_ARGUMENT and "'size'" in why
    code, why = refused(
        c.CreateVolume,
        pb.CreateVolumeRequest(name="v", volume_capabilities=[mount_cap()], parameters={"chunkSize": "3K"}),
    )
    assert code == Code.INVALID_ARGUMENT and "power of two" in why


def test_invalid_argument_for_an_unsupported_capability_with_the_reason(
    plugin: Plugin, kubelet: Path
) -> None:
    create(plugin, "d", mount_cap())
    code, why = refused(
        plugin.node.NodeStageVolume,
        pb.NodeStageVolumeRequest(
            volume_id="d", staging_target_path=str(kubelet / "s"), volume_capability=block_cap()
        ),
    )
    assert code == Code.INVALID_ARGUMENT and "raw block device" in why
    multi = mount_cap(pb.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER)
    code, why = refused(
        plugin.controller.CreateVolume, pb.CreateVolumeRequest(name="m", volume_capabilities=[multi])
    )
    assert code == Code.INVALID_ARGUMENT and "one node" in why


def test_not_found_for_an_unknown_volume_or_snapshot(plugin: Plugin, kubelet: Path) -> None:
    code, why = refused(
        plugin.controller.ControllerGetVolume, pb.ControllerGetVolumeRequest(volume_id="nope")
    )
    assert code == Code.NOT_FOUND and "nope" in why
    code, why = refused(
        plugin.node.NodeStageVolume,
        pb.NodeStageVolumeRequest(
            volume_id="nope", staging_target_path=str(kubelet / "s"), volume_capability=mount_cap()
        ),
    )
    assert code == Code.NOT_FOUND
    request = pb.CreateVolumeRequest(
        name="v", volume_capabilities=[mount_cap()], volume_content_source=from_snapshot("nope@3")
    )
    assert refused(plugin.controller.CreateVolume, request)[0] == Code.NOT_FOUND
    assert plugin.controller.ListVolumes(pb.ListVolumesRequest()).entries == []  # (nothing made)


def test_already_exists_for_a_name_taken_with_another_spec(plugin: Plugin) -> None:
    create(plugin, "v", mount_cap(), 1 << 20)
    code, why = refused(
        plugin.controller.CreateVolume,
        pb.CreateVolumeRequest(name="v", volume_capabilities=[mount_cap()], parameters={"kind": "block"}),
    )
    assert code == Code.ALREADY_EXISTS and "another spec" in why
    create(plugin, "w", mount_cap())
    snapshot(plugin, "v", "s")
    code, why = refused(
        plugin.controller.CreateSnapshot, pb.CreateSnapshotRequest(source_volume_id="w", name="s")
    )
    assert code == Code.ALREADY_EXISTS and "of volume 'v'" in why


def test_failed_precondition_while_in_use(plugin: Plugin, kubelet: Path) -> None:
    create(plugin, "v", mount_cap())
    staging, target = kubelet / "staging" / "v", kubelet / "pods" / "a" / "v"
    code, why = refused(
        plugin.node.NodePublishVolume,
        pb.NodePublishVolumeRequest(
            volume_id="v",
            staging_target_path=str(staging),
            target_path=str(target),
            volume_capability=mount_cap(),
        ),
    )
    assert code == Code.FAILED_PRECONDITION and "not staged" in why
    stage(plugin, "v", staging, mount_cap())
    code, why = refused(plugin.controller.DeleteVolume, pb.DeleteVolumeRequest(volume_id="v"))
    assert code == Code.FAILED_PRECONDITION and "staged" in why
    publish(plugin, "v", staging, target, mount_cap())
    code, why = refused(
        plugin.node.NodeUnstageVolume,
        pb.NodeUnstageVolumeRequest(volume_id="v", staging_target_path=str(staging)),
    )
    assert code == Code.FAILED_PRECONDITION and "still published" in why
    unpublish(plugin, "v", target)
    unstage(plugin, "v", staging)
    snap = snapshot(plugin, "v", "s")
    create(plugin, "clone", mount_cap(), volume_content_source=from_snapshot(snap.snapshot_id))
    code, why = refused(
        plugin.controller.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id)
    )
    assert code == Code.FAILED_PRECONDITION and "clone" in why
    code, why = refused(plugin.controller.DeleteVolume, pb.DeleteVolumeRequest(volume_id="v"))
    assert code == Code.FAILED_PRECONDITION and "clone" in why


@contextlib.contextmanager
def stopped_create(store: Path, name: str) -> Iterator[int]:
    """`casfs volume create NAME --blank-block 1G` stopped (SIGSTOP) with phase creating
    recorded: a live process holds the volume; let go on at the end."""
    env = {**os.environ, "CASFS_STOP": "create:after-claim"}
    cmd = [sys.executable, "-m", "casfs", "-s", str(store), "volume", "create", name, "--blank-block", "1G"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_stopped(proc.pid, lambda: proc.poll() is None)
        yield proc.pid
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=60) == 0


def test_aborted_while_another_process_holds_the_volumes_phase(plugin: Plugin, store: Path) -> None:
    with stopped_create(store, "held") as pid:
        request = pb.CreateVolumeRequest(name="held", volume_capabilities=[block_cap()])
        code, why = refused(plugin.controller.CreateVolume, request)
        assert code == Code.ABORTED and f"process {pid}" in why
        code, why = refused(plugin.controller.DeleteVolume, pb.DeleteVolumeRequest(volume_id="held"))
        assert code == Code.ABORTED
    plugin.controller.ControllerGetVolume(
        pb.ControllerGetVolumeRequest(volume_id="held")
    )  # (made, by the CLI)


def test_aborted_for_a_pagination_token_not_handed_out(plugin: Plugin) -> None:
    code, why = refused(plugin.controller.ListVolumes, pb.ListVolumesRequest(starting_token="10"))
    assert code == Code.ABORTED and "token" in why
    code, why = refused(plugin.controller.ListSnapshots, pb.ListSnapshotsRequest(starting_token="v:x"))
    assert code == Code.ABORTED


def test_out_of_range_for_a_capacity_casfs_cannot_give(plugin: Plugin) -> None:
    too_big = pb.CapacityRange(required_bytes=MAX_BLOCK_SIZE + (1 << 20))
    request = pb.CreateVolumeRequest(name="big", volume_capabilities=[block_cap()], capacity_range=too_big)
    code, why = refused(plugin.controller.CreateVolume, request)
    assert code == Code.OUT_OF_RANGE and "16 TiB" in why
    # 100 KiB asked, 120 KiB at most: no whole number of 32 KiB chunks fits (128 KiB).
    odd = pb.CapacityRange(required_bytes=100 << 10, limit_bytes=120 << 10)
    request = pb.CreateVolumeRequest(name="odd", volume_capabilities=[block_cap()], capacity_range=odd)
    assert refused(plugin.controller.CreateVolume, request)[0] == Code.OUT_OF_RANGE


def test_resource_exhausted_for_a_topology_elsewhere(plugin: Plugin) -> None:
    elsewhere = pb.TopologyRequirement(
        requisite=[pb.Topology(segments={"topology.csi.casfs.dev/node": "node-2"})]
    )
    request = pb.CreateVolumeRequest(
        name="v", volume_capabilities=[mount_cap()], accessibility_requirements=elsewhere
    )
    code, why = refused(plugin.controller.CreateVolume, request)
    assert code == Code.RESOURCE_EXHAUSTED and "node-1" in why


def test_resource_exhausted_for_a_full_store(tmp_path: Path, stores: Stores) -> None:
    with kernel_mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=8m", "tmpfs") as small:
        store = stores.add(small / "store")
        Repository.init(store).close()
        with plugin_running(store, tmp_path / "kubelet") as p:
            filler = small / "filler"
            with open(filler, "wb") as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\xff" * (1 << 20))
            code, why = refused(
                p.controller.CreateVolume, pb.CreateVolumeRequest(name="v", volume_capabilities=[mount_cap()])
            )
            assert code == Code.RESOURCE_EXHAUSTED and "space" in why
            filler.unlink()
            create(p, "v", mount_cap())  # (room again: the same request goes through)
        from tests.helpers.fsck import fsck_clean

        fsck_clean(store)  # here: the tmpfs is gone when the test ends


def test_failed_precondition_for_deleting_a_volume_staged_read_only(plugin: Plugin, kubelet: Path) -> None:
    """A read-only mount holds no phase: the plugin asks the daemons' run files."""
    create(plugin, "v", mount_cap())
    staging = kubelet / "staging" / "v"
    stage(plugin, "v", staging, mount_cap(pb.VolumeCapability.AccessMode.SINGLE_NODE_READER_ONLY))
    code, why = refused(plugin.controller.DeleteVolume, pb.DeleteVolumeRequest(volume_id="v"))
    assert code == Code.FAILED_PRECONDITION and str(staging) in why
    entry = plugin.controller.ListVolumes(pb.ListVolumesRequest()).entries[0]
    assert list(entry.status.published_node_ids) == ["node-1"]
    unstage(plugin, "v", staging)
    plugin.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id="v"))
