"""The kubelet flows over a real socket, with real FUSE mounts, binds and loop devices:
create, stage, publish, write, unpublish, unstage (the snapshot at unmount), snapshot,
a volume from that snapshot published elsewhere with the data there. Every RPC is sent
twice: a repeat after success succeeds and does not do the work again."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from casfs.csi.proto import csi_pb2 as pb
from casfs.fuse.mountinfo import mounts
from tests.helpers.csi import (
    Mode,
    Plugin,
    block_cap,
    create,
    from_snapshot,
    mount_cap,
    publish,
    snapshot,
    snapshots_of,
    stage,
    unpublish,
    unstage,
)
from tests.helpers.mount import kernel_mounted


def twice_create(p: Plugin, name: str, cap: pb.VolumeCapability, size: int = 0, **kw: object) -> pb.Volume:
    first = create(p, name, cap, size, **kw)
    assert create(p, name, cap, size, **kw) == first
    return first


def bring_up(
    p: Plugin, vid: str, staging: Path, target: Path, cap: pb.VolumeCapability, ro: bool = False
) -> None:
    for _ in range(2):
        stage(p, vid, staging, cap)
    for _ in range(2):
        publish(p, vid, staging, target, cap, readonly=ro)
    assert [m.mountpoint for m in mounts()].count(str(target)) == 1  # (the repeat stacked nothing)


def take_down(p: Plugin, vid: str, staging: Path, target: Path) -> None:
    for _ in range(2):
        unpublish(p, vid, target)
    assert not target.exists()
    for _ in range(2):
        unstage(p, vid, staging)


def test_directory_volume_flow(plugin: Plugin, kubelet: Path) -> None:
    cap = mount_cap()
    vol = twice_create(plugin, "pvc-dir", cap, 1 << 20)
    assert vol.volume_id == "pvc-dir" and vol.capacity_bytes == 1 << 20
    assert dict(vol.accessible_topology[0].segments) == {"topology.csi.casfs.dev/node": "node-1"}
    staging, target = kubelet / "staging" / "pvc-dir", kubelet / "pods" / "a" / "volumes" / "data"
    bring_up(plugin, vol.volume_id, staging, target, cap)
    (target / "hello.txt").write_text("hello from a pod\n")
    ro_target = kubelet / "pods" / "b" / "volumes" / "data"
    publish(plugin, vol.volume_id, staging, ro_target, cap, readonly=True)
    assert (ro_target / "hello.txt").read_text() == "hello from a pod\n"
    with pytest.raises(OSError) as refused:
        (ro_target / "other.txt").write_text("no")
    assert refused.value.errno == errno.EROFS
    unpublish(plugin, vol.volume_id, ro_target)
    take_down(plugin, vol.volume_id, staging, target)
    at_unmount = snapshots_of(plugin, vol.volume_id)
    assert [s.snapshot_id for s in at_unmount] == ["pvc-dir@1"]

    snap = snapshot(plugin, vol.volume_id, "snap-1")
    assert snapshot(plugin, vol.volume_id, "snap-1") == snap
    assert snap.ready_to_use and snap.source_volume_id == "pvc-dir" and snap.size_bytes > 0
    restored = twice_create(
        plugin, "pvc-restored", cap, volume_content_source=from_snapshot(snap.snapshot_id)
    )
    assert restored.content_source.snapshot.snapshot_id == snap.snapshot_id
    staging2, target2 = kubelet / "staging" / "pvc-restored", kubelet / "pods" / "c" / "volumes" / "data"
    bring_up(plugin, restored.volume_id, staging2, target2, cap)
    assert (target2 / "hello.txt").read_text() == "hello from a pod\n"
    take_down(plugin, restored.volume_id, staging2, target2)

    for vid in ("pvc-restored", "pvc-dir"):
        for _ in range(2):
            plugin.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid))
    assert plugin.controller.ListVolumes(pb.ListVolumesRequest()).entries == []


def test_block_volume_flow(plugin: Plugin, kubelet: Path, tmp_path: Path) -> None:
    cap = block_cap()
    vol = twice_create(plugin, "pvc-blk", cap, 64 << 20)
    assert vol.capacity_bytes == 64 << 20 and dict(vol.volume_context) == {"kind": "block"}
    staging, device = kubelet / "staging" / "pvc-blk", kubelet / "pods" / "a" / "devices" / "disk"
    bring_up(plugin, vol.volume_id, staging, device, cap)
    assert os.path.getsize(staging / "disk") == 64 << 20
    mkfs = subprocess.run(["mkfs.ext4", "-q", "-F", device], capture_output=True, text=True, timeout=120)
    assert mkfs.returncode == 0, mkfs.stderr
    with kernel_mounted(tmp_path / "ext4", device) as fs:
        (fs / "inside.txt").write_text("written on ext4 over a loop device over casfs\n")
    fsck = subprocess.run(["e2fsck", "-fn", device], capture_output=True, text=True, timeout=120)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    take_down(plugin, vol.volume_id, staging, device)
    assert [s.snapshot_id for s in snapshots_of(plugin, vol.volume_id)] == ["pvc-blk@1"]
    assert subprocess.run(["losetup", "-j", staging / "disk"], capture_output=True, text=True).stdout == ""

    snap = snapshot(plugin, vol.volume_id, "blk-snap")
    restored = twice_create(
        plugin, "pvc-blk-2", cap, 64 << 20, volume_content_source=from_snapshot(snap.snapshot_id)
    )
    staging2, device2 = kubelet / "staging" / "pvc-blk-2", kubelet / "pods" / "b" / "devices" / "disk"
    bring_up(plugin, restored.volume_id, staging2, device2, cap, ro=True)
    fd = os.open(device2, os.O_WRONLY)  # (a read-only loop device opens, and refuses writes)
    try:
        with pytest.raises(OSError) as refused:
            os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    assert refused.value.errno in (errno.EROFS, errno.EPERM)
    with kernel_mounted(tmp_path / "ext4-ro", "-o", "ro,noload", device2) as fs:
        assert (fs / "inside.txt").read_text() == "written on ext4 over a loop device over casfs\n"
    take_down(plugin, restored.volume_id, staging2, device2)


def test_a_read_only_access_mode_stages_read_only(plugin: Plugin, kubelet: Path) -> None:
    cap = mount_cap(Mode.SINGLE_NODE_READER_ONLY)
    vol = create(plugin, "pvc-ro", mount_cap())
    staging, target = kubelet / "staging" / "pvc-ro", kubelet / "pods" / "a" / "ro"
    bring_up(plugin, vol.volume_id, staging, target, cap)
    with pytest.raises(OSError) as refused:
        (target / "x").write_text("no")
    assert refused.value.errno == errno.EROFS
    take_down(plugin, vol.volume_id, staging, target)
    assert snapshots_of(plugin, vol.volume_id) == []  # (nothing changed: no snapshot at unmount)


def test_mount_flags_are_honoured_and_unknown_ones_refused_by_name(plugin: Plugin, kubelet: Path) -> None:
    import grpc

    vol = create(plugin, "pvc-flags", mount_cap())
    staging, target = kubelet / "staging" / "pvc-flags", kubelet / "pods" / "a" / "v"
    stage(plugin, vol.volume_id, staging, mount_cap())
    publish(plugin, vol.volume_id, staging, target, mount_cap(flags=("noexec", "nosuid")))
    options = next(m.options for m in mounts() if m.mountpoint == str(target)).split(",")
    assert "noexec" in options and "nosuid" in options
    plain = kubelet / "pods" / "c" / "v"  # (no flags: suid, as a disk's volume is)
    publish(plugin, vol.volume_id, staging, plain, mount_cap())
    assert "nosuid" not in next(m.options for m in mounts() if m.mountpoint == str(plain)).split(",")
    unpublish(plugin, vol.volume_id, plain)
    with pytest.raises(grpc.RpcError) as refused:
        publish(
            plugin, vol.volume_id, staging, kubelet / "pods" / "b" / "v", mount_cap(flags=("data=journal",))
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "data=journal" in str(refused.value.details())
    take_down(plugin, vol.volume_id, staging, target)


def test_a_snapshot_of_a_staged_volume_is_taken_live(plugin: Plugin, kubelet: Path) -> None:
    cap = mount_cap()
    vol = create(plugin, "pvc-live", cap)
    staging, target = kubelet / "staging" / "pvc-live", kubelet / "pods" / "a" / "v"
    bring_up(plugin, vol.volume_id, staging, target, cap)
    (target / "before.txt").write_text("in the snapshot\n")
    snap = snapshot(plugin, vol.volume_id, "live")
    assert snapshot(plugin, vol.volume_id, "live") == snap
    (target / "after.txt").write_text("not in it\n")
    clone = create(plugin, "pvc-live-clone", cap, volume_content_source=from_snapshot(snap.snapshot_id))
    staging2, target2 = kubelet / "staging" / "pvc-live-clone", kubelet / "pods" / "b" / "v"
    bring_up(plugin, clone.volume_id, staging2, target2, cap)
    assert sorted(os.listdir(target2)) == ["before.txt"]
    take_down(plugin, clone.volume_id, staging2, target2)
    take_down(plugin, vol.volume_id, staging, target)
