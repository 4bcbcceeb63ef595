"""Where a volume comes from (an image in the store, a snapshot, another volume), what
the plugin says of its health, and a repeat whose record a crash lost."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from casfs import images
from casfs.catalog import transaction
from casfs.catalog import volumes as volume_rows
from casfs.csi.proto import csi_pb2 as pb
from casfs.repo import Repository
from tests.helpers.cli import ok
from tests.helpers.csi import (
    Plugin,
    block_cap,
    create,
    from_volume,
    mount_cap,
    publish,
    stage,
    unpublish,
    unstage,
)
from tests.helpers.mount import kernel_mounted


def test_a_directory_volume_from_an_image(plugin: Plugin, store: Path, kubelet: Path, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "os-release").write_text("ID=casfs\n")
    with contextlib.closing(Repository.open(store)) as repo:
        images.import_image(repo, "rootfs", tree)
    vol = create(plugin, "from-image", mount_cap(), parameters={"image": "rootfs"})
    staging, target = kubelet / "staging" / "i", kubelet / "pods" / "a" / "i"
    stage(plugin, vol.volume_id, staging, mount_cap())
    publish(plugin, vol.volume_id, staging, target, mount_cap())
    assert (target / "etc" / "os-release").read_text() == "ID=casfs\n"
    (target / "etc" / "os-release").write_text("ID=changed\n")  # (copy-on-write: the image keeps its own)
    unpublish(plugin, vol.volume_id, target)
    unstage(plugin, vol.volume_id, staging)
    again = create(plugin, "from-image-2", mount_cap(), parameters={"image": "rootfs"})
    stage(plugin, again.volume_id, staging, mount_cap())
    assert (staging / "etc" / "os-release").read_text() == "ID=casfs\n"
    unstage(plugin, again.volume_id, staging)


def test_a_block_volume_from_an_image_grown_to_its_claim(
    plugin: Plugin, store: Path, kubelet: Path, tmp_path: Path
) -> None:
    disk = tmp_path / "disk.raw"
    with open(disk, "wb") as f:
        f.truncate(8 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(disk)], check=True, timeout=60)
    with kernel_mounted(tmp_path / "m", "-o", "loop", disk) as fs:
        (fs / "in-the-image").write_text("yes\n")
    with contextlib.closing(Repository.open(store)) as repo:
        images.import_image(repo, "disk", disk)
    vol = create(plugin, "disk-vol", block_cap(), 16 << 20, parameters={"image": "disk"})
    assert vol.capacity_bytes == 16 << 20  # (the claim is honoured: the clone grown to it)
    assert create(plugin, "disk-vol", block_cap(), 16 << 20, parameters={"image": "disk"}) == vol
    staging, device = kubelet / "staging" / "d", kubelet / "pods" / "a" / "d"
    stage(plugin, vol.volume_id, staging, block_cap())
    publish(plugin, vol.volume_id, staging, device, block_cap(), readonly=True)
    with kernel_mounted(tmp_path / "m2", "-o", "ro,noload", device) as fs:
        assert (fs / "in-the-image").read_text() == "yes\n"
    unpublish(plugin, vol.volume_id, device)
    unstage(plugin, vol.volume_id, staging)


def test_a_volume_cloned_from_a_staged_volume_has_its_newest_state(plugin: Plugin, kubelet: Path) -> None:
    create(plugin, "src", mount_cap())
    staging, target = kubelet / "staging" / "src", kubelet / "pods" / "a" / "src"
    stage(plugin, "src", staging, mount_cap())
    publish(plugin, "src", staging, target, mount_cap())
    (target / "written.txt").write_text("while published\n")
    clone = create(plugin, "copy", mount_cap(), volume_content_source=from_volume("src"))
    assert clone.content_source.volume.volume_id == "src"
    staging2 = kubelet / "staging" / "copy"
    stage(plugin, "copy", staging2, mount_cap())
    assert (staging2 / "written.txt").read_text() == "while published\n"
    unstage(plugin, "copy", staging2)
    unpublish(plugin, "src", target)
    unstage(plugin, "src", staging)


def test_a_volume_whose_last_mount_lost_changes_is_abnormal(plugin: Plugin, store: Path) -> None:
    create(plugin, "hurt", mount_cap())
    with contextlib.closing(Repository.open(store)) as repo, transaction(repo.conn):
        note = {"pid": 4711, "time": time.time(), "error": "No space left on device", "unsaved": [["/a", 10]]}
        volume_rows.record_unsaved(repo.conn, "hurt", note)
    got = plugin.controller.ControllerGetVolume(pb.ControllerGetVolumeRequest(volume_id="hurt"))
    assert got.status.volume_condition.abnormal
    assert "could not save /a (10 bytes)" in got.status.volume_condition.message
    listed = plugin.controller.ListVolumes(pb.ListVolumesRequest()).entries
    assert listed[0].status.volume_condition.abnormal


def test_a_repeat_whose_record_was_lost_is_answered_by_the_volumes_spec(plugin: Plugin, store: Path) -> None:
    made = create(plugin, "v", block_cap(), 1 << 20)
    (store / "csi" / "volumes" / "v.json").unlink()  # (as a crash right after the create could)
    assert create(plugin, "v", block_cap(), 1 << 20) == made
    with pytest.raises(grpc.RpcError) as other:
        create(plugin, "v", block_cap(), 2 << 20)
    assert other.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_a_volume_made_by_the_cli_is_not_taken_by_another_request(plugin: Plugin, store: Path) -> None:
    ok(store, "volume", "create", "mine", "--blank-block", "4M")
    with pytest.raises(grpc.RpcError) as taken:
        create(plugin, "mine", mount_cap())
    assert taken.value.code() == grpc.StatusCode.ALREADY_EXISTS


@pytest.mark.no_fsck("a blob is corrupted on purpose: fsck reports it")
def test_a_volume_whose_mount_met_a_corrupt_blob_is_abnormal(
    plugin: Plugin, store: Path, kubelet: Path, tmp_path: Path
) -> None:
    import errno
    import mmap
    import os

    from casfs.ids import ChunkNo
    from casfs.kinds import VolumeKind
    from casfs.snapshots.chunkmap import Content
    from casfs.store.ids import BlobId
    from tests.helpers import blobs as blob_files

    chunk, size = VolumeKind.BLOCK.default_chunk_size, 1 << 20
    raw = tmp_path / "random.raw"
    raw.write_bytes(os.urandom(size))
    with contextlib.closing(Repository.open(store)) as repo:
        images.import_image(repo, "rnd", raw)
        root = BlobId(bytes.fromhex(images.get_image(repo, "rnd").root or ""))
        blob_files.corrupt(repo, Content(repo.get, root, size, chunk).chunk(ChunkNo(7)))
    create(plugin, "hurt", block_cap(), parameters={"image": "rnd"})
    staging, device = kubelet / "staging" / "h", kubelet / "pods" / "a" / "h"
    stage(plugin, "hurt", staging, block_cap())
    publish(plugin, "hurt", staging, device, block_cap())
    fd = os.open(staging / "disk", os.O_RDONLY | os.O_DIRECT)
    try:
        with pytest.raises(OSError) as failed:
            os.preadv(fd, [mmap.mmap(-1, 4096)], 7 * chunk)
        assert failed.value.errno == errno.EIO
    finally:
        os.close(fd)
    request = pb.NodeGetVolumeStatsRequest(volume_id="hurt", volume_path=str(device))
    condition = plugin.node.NodeGetVolumeStats(request).volume_condition
    assert condition.abnormal and "corrupt" in condition.message
    unpublish(plugin, "hurt", device)
    unstage(plugin, "hurt", staging)


def test_the_record_of_a_deleted_volume_does_not_speak_for_a_new_one_of_that_name(
    plugin: Plugin, store: Path
) -> None:
    create(plugin, "v", mount_cap(), 1 << 20)
    ok(store, "volume", "rm", "v")  # (behind the plugin's back: the record stays)
    ok(store, "volume", "create", "v", "--blank-block", "4M")
    with pytest.raises(grpc.RpcError) as taken:
        create(plugin, "v", mount_cap(), 1 << 20)
    assert taken.value.code() == grpc.StatusCode.ALREADY_EXISTS
