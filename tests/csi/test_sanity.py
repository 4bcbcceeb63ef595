"""The cases of the CSI conformance suite (kubernetes-csi/csi-test, `csi-sanity`) for the
capabilities the plugin advertises, written again here so that CI runs them without Go:
identity, controller create/delete (idempotency, maximum-length names, sources),
validation, listing and pagination, capacity, snapshots, expansion, get volume, and the
node's argument checks, stats, expansion and full cycle. Names follow csi-sanity's
`Describe`/`It` texts where there is one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from casfs.csi.proto import csi_pb2 as pb
from tests.helpers.csi import (
    Plugin,
    code_of,
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

Code = grpc.StatusCode
SIZE = 10 << 30  # csi-sanity's default test volume size
MAX_NAME = "a" * 128


def vol_req(name: str, size: int = 0, **kw: Any) -> pb.CreateVolumeRequest:
    return pb.CreateVolumeRequest(
        name=name,
        volume_capabilities=[mount_cap()],
        capacity_range=pb.CapacityRange(required_bytes=size),
        **kw,
    )


# -- Identity ----------------------------------------------------------------------------


def test_identity_get_plugin_info_returns_a_name_and_a_version(plugin: Plugin) -> None:
    info = plugin.identity.GetPluginInfo(pb.GetPluginInfoRequest())
    assert info.name == "csi.casfs.dev" and info.vendor_version
    assert len(info.name) <= 63 and info.name[0].isalnum() and info.name[-1].isalnum()


def test_identity_get_plugin_capabilities_are_valid(plugin: Plugin) -> None:
    caps = plugin.identity.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest()).capabilities
    Service = pb.PluginCapability.Service
    services = {c.service.type for c in caps if c.WhichOneof("type") == "service"}
    assert services == {Service.CONTROLLER_SERVICE, Service.VOLUME_ACCESSIBILITY_CONSTRAINTS}
    expansion = [c.volume_expansion.type for c in caps if c.WhichOneof("type") == "volume_expansion"]
    assert expansion == [pb.PluginCapability.VolumeExpansion.OFFLINE]


def test_identity_probe_is_ready(plugin: Plugin) -> None:
    assert plugin.identity.Probe(pb.ProbeRequest()).ready.value


def test_a_node_only_plugin_does_not_advertise_the_controller(store: Path, kubelet: Path) -> None:
    from tests.helpers.csi import plugin_running

    with plugin_running(store, kubelet, "--services", "node") as p:
        caps = p.identity.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest()).capabilities
        assert pb.PluginCapability.Service.CONTROLLER_SERVICE not in {c.service.type for c in caps}
        assert code_of(p.controller.ListVolumes, pb.ListVolumesRequest()) == Code.UNIMPLEMENTED
        assert p.node.NodeGetInfo(pb.NodeGetInfoRequest()).node_id == "node-1"


# -- Controller: create and delete --------------------------------------------------------


def test_controller_get_capabilities_are_valid(plugin: Plugin) -> None:
    caps = plugin.controller.ControllerGetCapabilities(pb.ControllerGetCapabilitiesRequest()).capabilities
    Rpc = pb.ControllerServiceCapability.RPC
    got = {c.rpc.type for c in caps}
    assert {Rpc.CREATE_DELETE_VOLUME, Rpc.CREATE_DELETE_SNAPSHOT, Rpc.CLONE_VOLUME, Rpc.EXPAND_VOLUME} <= got
    assert Rpc.PUBLISH_UNPUBLISH_VOLUME not in got and Rpc.UNKNOWN not in got


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (pb.CreateVolumeRequest(volume_capabilities=[mount_cap()]), Code.INVALID_ARGUMENT),  # no name
        (pb.CreateVolumeRequest(name="v"), Code.INVALID_ARGUMENT),  # no capabilities
        (vol_req("v", volume_content_source=from_snapshot("some-snapshot-id")), Code.NOT_FOUND),
        (vol_req("v", volume_content_source=from_volume("some-volume-id")), Code.NOT_FOUND),
        (
            pb.CreateVolumeRequest(name="v", volume_capabilities=[pb.VolumeCapability()]),
            Code.INVALID_ARGUMENT,
        ),
    ],
    ids=[
        "no-name",
        "no-capabilities",
        "source-snapshot-missing",
        "source-volume-missing",
        "empty-capability",
    ],
)
def test_create_volume_fails(plugin: Plugin, request_: pb.CreateVolumeRequest, expected: Code) -> None:
    assert code_of(plugin.controller.CreateVolume, request_) == expected


def test_create_volume_returns_appropriate_values_with_and_without_capacity(plugin: Plugin) -> None:
    plain = plugin.controller.CreateVolume(vol_req("sanity-no-capacity")).volume
    assert plain.volume_id and plain.capacity_bytes == 0
    sized = plugin.controller.CreateVolume(vol_req("sanity-capacity", SIZE)).volume
    assert sized.capacity_bytes == 0 or sized.capacity_bytes >= SIZE
    for v in (plain, sized):
        plugin.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v.volume_id))


def test_create_volume_with_an_existing_name_and_the_same_or_another_capacity(plugin: Plugin) -> None:
    first = plugin.controller.CreateVolume(vol_req("sanity-idem", SIZE)).volume
    assert plugin.controller.CreateVolume(vol_req("sanity-idem", SIZE)).volume == first
    assert code_of(plugin.controller.CreateVolume, vol_req("sanity-idem", 2 * SIZE)) == Code.ALREADY_EXISTS


def test_create_volume_with_a_maximum_length_name(plugin: Plugin) -> None:
    vol = plugin.controller.CreateVolume(vol_req(MAX_NAME)).volume
    assert plugin.controller.CreateVolume(vol_req(MAX_NAME)).volume == vol
    plugin.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vol.volume_id))


def test_a_name_casfs_cannot_use_gets_a_stable_id(plugin: Plugin) -> None:
    vol = plugin.controller.CreateVolume(vol_req("ns/claim with spaces")).volume
    assert vol.volume_id.startswith("csi-")
    assert plugin.controller.CreateVolume(vol_req("ns/claim with spaces")).volume.volume_id == vol.volume_id


def test_create_volume_from_an_existing_source_snapshot_and_volume(plugin: Plugin) -> None:
    src = create(plugin, "sanity-src", mount_cap())
    snap = snapshot(plugin, src.volume_id, "sanity-src-snap")
    from_snap = plugin.controller.CreateVolume(
        vol_req("sanity-from-snap", volume_content_source=from_snapshot(snap.snapshot_id))
    )
    assert from_snap.volume.content_source.snapshot.snapshot_id == snap.snapshot_id
    from_vol = plugin.controller.CreateVolume(
        vol_req("sanity-from-vol", volume_content_source=from_volume(src.volume_id))
    )
    assert from_vol.volume.content_source.volume.volume_id == src.volume_id
    for vid in ("sanity-from-vol", "sanity-from-snap"):
        plugin.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid))
    plugin.controller.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id))
    plugin.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id=src.volume_id))


def test_delete_volume(plugin: Plugin) -> None:
    c = plugin.controller
    assert code_of(c.DeleteVolume, pb.DeleteVolumeRequest()) == Code.INVALID_ARGUMENT
    assert code_of(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id="reallyfakevolumeid")) == Code.OK
    assert code_of(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id="not a valid id!")) == Code.OK
    vol = create(plugin, "sanity-delete", mount_cap())
    assert code_of(c.DeleteVolume, pb.DeleteVolumeRequest(volume_id=vol.volume_id)) == Code.OK
    assert (
        code_of(c.ControllerGetVolume, pb.ControllerGetVolumeRequest(volume_id=vol.volume_id))
        == Code.NOT_FOUND
    )


# -- Controller: validate, list, capacity, get --------------------------------------------


def test_validate_volume_capabilities(plugin: Plugin) -> None:
    c = plugin.controller
    vol = create(plugin, "sanity-validate", mount_cap())
    assert code_of(
        c.ValidateVolumeCapabilities, pb.ValidateVolumeCapabilitiesRequest(volume_capabilities=[mount_cap()])
    ) == (Code.INVALID_ARGUMENT)
    assert code_of(
        c.ValidateVolumeCapabilities, pb.ValidateVolumeCapabilitiesRequest(volume_id=vol.volume_id)
    ) == (Code.INVALID_ARGUMENT)
    missing = pb.ValidateVolumeCapabilitiesRequest(volume_id="some-vol-id", volume_capabilities=[mount_cap()])
    assert code_of(c.ValidateVolumeCapabilities, missing) == Code.NOT_FOUND
    ok = c.ValidateVolumeCapabilities(
        pb.ValidateVolumeCapabilitiesRequest(volume_id=vol.volume_id, volume_capabilities=[mount_cap()])
    )
    assert list(ok.confirmed.volume_capabilities) == [mount_cap()]
    multi = mount_cap(pb.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER)
    no = c.ValidateVolumeCapabilities(
        pb.ValidateVolumeCapabilitiesRequest(volume_id=vol.volume_id, volume_capabilities=[multi])
    )
    assert not no.HasField("confirmed") and no.message


def test_list_volumes_pagination_survives_additions_and_deletions_between_pages(plugin: Plugin) -> None:
    c = plugin.controller
    for i in range(5):
        create(plugin, f"sanity-list-{i}", mount_cap())
    first = c.ListVolumes(pb.ListVolumesRequest(max_entries=2))
    assert [e.volume.volume_id for e in first.entries] == [
        "sanity-list-0",
        "sanity-list-1",
    ] and first.next_token
    c.DeleteVolume(pb.DeleteVolumeRequest(volume_id="sanity-list-1"))  # the last one of the page
    create(plugin, "sanity-list-00", mount_cap())  # before the token: not seen, and nothing shifts
    create(plugin, "sanity-list-9", mount_cap())  # after it: seen
    rest: list[str] = []
    token = first.next_token
    while token:
        page = c.ListVolumes(pb.ListVolumesRequest(max_entries=2, starting_token=token))
        rest += [e.volume.volume_id for e in page.entries]
        token = page.next_token
    assert rest == ["sanity-list-2", "sanity-list-3", "sanity-list-4", "sanity-list-9"]
    assert code_of(c.ListVolumes, pb.ListVolumesRequest(max_entries=-1)) == Code.INVALID_ARGUMENT


def test_list_volumes_shows_where_a_volume_is_published(plugin: Plugin, kubelet: Path) -> None:
    create(plugin, "sanity-pub", mount_cap())
    stage(plugin, "sanity-pub", kubelet / "s", mount_cap())
    entry = plugin.controller.ListVolumes(pb.ListVolumesRequest()).entries[0]
    assert list(entry.status.published_node_ids) == ["node-1"] and not entry.status.volume_condition.abnormal
    unstage(plugin, "sanity-pub", kubelet / "s")
    entry = plugin.controller.ListVolumes(pb.ListVolumesRequest()).entries[0]
    assert list(entry.status.published_node_ids) == []


def test_get_capacity(plugin: Plugin) -> None:
    c = plugin.controller
    assert c.GetCapacity(pb.GetCapacityRequest()).available_capacity > 0
    assert c.GetCapacity(pb.GetCapacityRequest(volume_capabilities=[mount_cap()])).available_capacity > 0
    multi = mount_cap(pb.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER)
    assert c.GetCapacity(pb.GetCapacityRequest(volume_capabilities=[multi])).available_capacity == 0
    other = pb.Topology(segments={"topology.csi.casfs.dev/node": "node-2"})
    assert c.GetCapacity(pb.GetCapacityRequest(accessible_topology=other)).available_capacity == 0


def test_controller_get_volume(plugin: Plugin) -> None:
    c = plugin.controller
    assert (
        code_of(c.ControllerGetVolume, pb.ControllerGetVolumeRequest(volume_id="some-vol-id"))
        == Code.NOT_FOUND
    )
    vol = create(plugin, "sanity-get", mount_cap(), 1 << 20)
    got = c.ControllerGetVolume(pb.ControllerGetVolumeRequest(volume_id=vol.volume_id))
    assert got.volume == vol and not got.status.volume_condition.abnormal


# -- Controller: snapshots ----------------------------------------------------------------


def test_create_snapshot(plugin: Plugin) -> None:
    c = plugin.controller
    vol = create(plugin, "sanity-snap-src", mount_cap())
    other = create(plugin, "sanity-snap-other", mount_cap())
    assert (
        code_of(c.CreateSnapshot, pb.CreateSnapshotRequest(source_volume_id=vol.volume_id))
        == Code.INVALID_ARGUMENT
    )
    assert code_of(c.CreateSnapshot, pb.CreateSnapshotRequest(name="s")) == Code.INVALID_ARGUMENT
    snap = snapshot(plugin, vol.volume_id, "sanity-snap")
    assert snapshot(plugin, vol.volume_id, "sanity-snap") == snap
    again = pb.CreateSnapshotRequest(source_volume_id=other.volume_id, name="sanity-snap")
    assert code_of(c.CreateSnapshot, again) == Code.ALREADY_EXISTS
    longest = snapshot(plugin, vol.volume_id, MAX_NAME)
    assert longest.snapshot_id != snap.snapshot_id and longest.ready_to_use


def test_delete_snapshot(plugin: Plugin) -> None:
    c = plugin.controller
    assert code_of(c.DeleteSnapshot, pb.DeleteSnapshotRequest()) == Code.INVALID_ARGUMENT
    assert code_of(c.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id="reallyfakesnapshotid")) == Code.OK
    vol = create(plugin, "sanity-delsnap", mount_cap())
    snap = snapshot(plugin, vol.volume_id, "s")
    assert code_of(c.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id)) == Code.OK
    assert code_of(c.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id)) == Code.OK


def test_list_snapshots(plugin: Plugin) -> None:
    c = plugin.controller
    a, b = create(plugin, "sanity-ls-a", mount_cap()), create(plugin, "sanity-ls-b", mount_cap())
    snaps = [snapshot(plugin, a.volume_id, f"a{i}") for i in range(3)] + [snapshot(plugin, b.volume_id, "b0")]
    everything = c.ListSnapshots(pb.ListSnapshotsRequest())
    assert [e.snapshot for e in everything.entries] == snaps
    by_id = c.ListSnapshots(pb.ListSnapshotsRequest(snapshot_id=snaps[1].snapshot_id))
    assert [e.snapshot for e in by_id.entries] == [snaps[1]]
    assert c.ListSnapshots(pb.ListSnapshotsRequest(snapshot_id="none@1")).entries == []
    assert c.ListSnapshots(pb.ListSnapshotsRequest(snapshot_id="garbage")).entries == []
    by_source = c.ListSnapshots(pb.ListSnapshotsRequest(source_volume_id=b.volume_id))
    assert [e.snapshot for e in by_source.entries] == [snaps[3]]
    assert c.ListSnapshots(pb.ListSnapshotsRequest(source_volume_id="none")).entries == []
    assert code_of(c.ListSnapshots, pb.ListSnapshotsRequest(starting_token="invalid-token")) == Code.ABORTED
    page = c.ListSnapshots(pb.ListSnapshotsRequest(max_entries=2))
    assert [e.snapshot for e in page.entries] == snaps[:2] and page.next_token
    added = snapshot(plugin, a.volume_id, "a3")  # between pages: it comes after a2, before b0
    rest = c.ListSnapshots(pb.ListSnapshotsRequest(starting_token=page.next_token))
    assert [e.snapshot for e in rest.entries] == [snaps[2], added, snaps[3]] and not rest.next_token


# -- Controller: expansion -----------------------------------------------------------------


def test_controller_expand_volume(plugin: Plugin) -> None:
    c = plugin.controller
    vol = create(plugin, "sanity-expand", mount_cap(), 1 << 30)
    assert code_of(
        c.ControllerExpandVolume,
        pb.ControllerExpandVolumeRequest(capacity_range=pb.CapacityRange(required_bytes=1)),
    ) == (Code.INVALID_ARGUMENT)
    assert (
        code_of(c.ControllerExpandVolume, pb.ControllerExpandVolumeRequest(volume_id=vol.volume_id))
        == Code.INVALID_ARGUMENT
    )
    grown = c.ControllerExpandVolume(
        pb.ControllerExpandVolumeRequest(
            volume_id=vol.volume_id, capacity_range=pb.CapacityRange(required_bytes=2 << 30)
        )
    )
    assert grown.capacity_bytes >= 2 << 30 and not grown.node_expansion_required
    got = c.ControllerGetVolume(pb.ControllerGetVolumeRequest(volume_id=vol.volume_id))
    assert got.volume.capacity_bytes == grown.capacity_bytes


def test_controller_expand_a_block_volume(plugin: Plugin, kubelet: Path) -> None:
    from tests.helpers.csi import block_cap

    c = plugin.controller
    vol = create(plugin, "sanity-expand-blk", block_cap(), 16 << 20)
    stage(plugin, vol.volume_id, kubelet / "s", block_cap())
    bigger = pb.ControllerExpandVolumeRequest(
        volume_id=vol.volume_id, capacity_range=pb.CapacityRange(required_bytes=32 << 20)
    )
    assert code_of(c.ControllerExpandVolume, bigger) == Code.FAILED_PRECONDITION  # (offline: staged)
    unstage(plugin, vol.volume_id, kubelet / "s")
    assert c.ControllerExpandVolume(bigger).capacity_bytes == 32 << 20
    assert c.ControllerExpandVolume(bigger).capacity_bytes == 32 << 20  # (a repeat: nothing to do)
    stage(plugin, vol.volume_id, kubelet / "s", block_cap())
    assert (kubelet / "s" / "disk").stat().st_size == 32 << 20
    device = kubelet / "pod" / "dev"
    publish(plugin, vol.volume_id, kubelet / "s", device, block_cap())
    request = pb.NodeExpandVolumeRequest(volume_id=vol.volume_id, volume_path=str(device))
    assert plugin.node.NodeExpandVolume(request).capacity_bytes == 32 << 20
    with open(device, "rb") as f:
        assert f.seek(0, 2) == 32 << 20  # (the loop device's size)
    unpublish(plugin, vol.volume_id, device)
    unstage(plugin, vol.volume_id, kubelet / "s")


# -- Node ---------------------------------------------------------------------------------


def test_node_get_capabilities_and_info(plugin: Plugin) -> None:
    caps = plugin.node.NodeGetCapabilities(pb.NodeGetCapabilitiesRequest()).capabilities
    Rpc = pb.NodeServiceCapability.RPC
    assert {c.rpc.type for c in caps} == {
        Rpc.STAGE_UNSTAGE_VOLUME,
        Rpc.GET_VOLUME_STATS,
        Rpc.EXPAND_VOLUME,
        Rpc.VOLUME_CONDITION,
        Rpc.SINGLE_NODE_MULTI_WRITER,
    }
    info = plugin.node.NodeGetInfo(pb.NodeGetInfoRequest())
    assert info.node_id == "node-1"
    assert dict(info.accessible_topology.segments) == {"topology.csi.casfs.dev/node": "node-1"}


def test_node_argument_checks(plugin: Plugin, kubelet: Path) -> None:
    n, s, t = plugin.node, str(kubelet / "staging"), str(kubelet / "target")
    cap = mount_cap()
    cases: list[tuple[Callable[[Any], object], object]] = [
        (n.NodeStageVolume, pb.NodeStageVolumeRequest(staging_target_path=s, volume_capability=cap)),
        (n.NodeStageVolume, pb.NodeStageVolumeRequest(volume_id="v", volume_capability=cap)),
        (n.NodeStageVolume, pb.NodeStageVolumeRequest(volume_id="v", staging_target_path=s)),
        (n.NodeUnstageVolume, pb.NodeUnstageVolumeRequest(staging_target_path=s)),
        (n.NodeUnstageVolume, pb.NodeUnstageVolumeRequest(volume_id="v")),
        (
            n.NodePublishVolume,
            pb.NodePublishVolumeRequest(staging_target_path=s, target_path=t, volume_capability=cap),
        ),
        (
            n.NodePublishVolume,
            pb.NodePublishVolumeRequest(volume_id="v", staging_target_path=s, volume_capability=cap),
        ),
        (
            n.NodePublishVolume,
            pb.NodePublishVolumeRequest(volume_id="v", staging_target_path=s, target_path=t),
        ),
        (
            n.NodePublishVolume,
            pb.NodePublishVolumeRequest(volume_id="v", target_path=t, volume_capability=cap),
        ),
        (n.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(target_path=t)),
        (n.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(volume_id="v")),
        (n.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_path=t)),
        (n.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_id="v")),
        (n.NodeExpandVolume, pb.NodeExpandVolumeRequest(volume_path=t)),
        (n.NodeExpandVolume, pb.NodeExpandVolumeRequest(volume_id="v")),
        (
            n.NodeStageVolume,
            pb.NodeStageVolumeRequest(volume_id="v", staging_target_path="relative", volume_capability=cap),
        ),
    ]
    assert [code_of(call, req) for call, req in cases] == [Code.INVALID_ARGUMENT] * len(cases)


def test_node_rpcs_for_a_missing_volume_or_path_are_not_found(plugin: Plugin, kubelet: Path) -> None:
    n, t = plugin.node, str(kubelet / "target")
    assert (
        code_of(n.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_id="some-vol-id", volume_path=t))
        == Code.NOT_FOUND
    )
    assert (
        code_of(n.NodeExpandVolume, pb.NodeExpandVolumeRequest(volume_id="some-vol-id", volume_path=t))
        == Code.NOT_FOUND
    )
    assert (
        code_of(n.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(volume_id="some-vol-id", target_path=t))
        == Code.NOT_FOUND
    )
    create(plugin, "v", mount_cap())
    fake = str(kubelet / "some" / "fake" / "path")
    assert (
        code_of(n.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_id="v", volume_path=fake))
        == Code.NOT_FOUND
    )
    assert (
        code_of(n.NodeExpandVolume, pb.NodeExpandVolumeRequest(volume_id="v", volume_path=fake))
        == Code.NOT_FOUND
    )


def test_node_full_cycle_with_stats_and_expansion(plugin: Plugin, kubelet: Path) -> None:
    """csi-sanity's "should work": create, stage, publish, stats, expand, unpublish (the
    target removed), unstage, delete."""
    cap = mount_cap()
    vol = create(plugin, "sanity-node", cap, 1 << 30)
    staging, target = kubelet / "staging", kubelet / "target"
    stage(plugin, vol.volume_id, staging, cap)
    publish(plugin, vol.volume_id, staging, target, cap)
    (target / "data").write_bytes(b"x" * 100_000)
    stats = plugin.node.NodeGetVolumeStats(
        pb.NodeGetVolumeStatsRequest(volume_id=vol.volume_id, volume_path=str(target))
    )
    by_unit = {u.unit: u for u in stats.usage}
    assert by_unit[pb.VolumeUsage.BYTES].total > 0 and by_unit[pb.VolumeUsage.BYTES].available > 0
    assert by_unit[pb.VolumeUsage.INODES].total >= 0
    assert not stats.volume_condition.abnormal
    grown = plugin.node.NodeExpandVolume(
        pb.NodeExpandVolumeRequest(
            volume_id=vol.volume_id,
            volume_path=str(target),
            capacity_range=pb.CapacityRange(required_bytes=1 << 30),
        )
    )
    assert grown.capacity_bytes == 1 << 30
    unpublish(plugin, vol.volume_id, target)
    assert not target.exists()
    unstage(plugin, vol.volume_id, staging)
    plugin.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vol.volume_id))


def test_each_rpc_logs_one_line_with_its_method_volume_code_and_time(plugin: Plugin) -> None:
    import re

    create(plugin, "logged", mount_cap())
    code_of(plugin.controller.ControllerGetVolume, pb.ControllerGetVolumeRequest(volume_id="nope"))
    lines = plugin.log().splitlines()
    assert any(re.search(r"CreateVolume volume=logged code=OK \d+\.\d ms$", line) for line in lines), lines
    assert any(
        re.search(r"ControllerGetVolume volume=nope code=NOT_FOUND \d+\.\d ms$", line) for line in lines
    )
