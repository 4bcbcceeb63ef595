"""The checked-in CSI modules are what csi.proto generates, and speak the spec's wire
numbers (a renumbered field would parse as garbage in kubelet)."""

from __future__ import annotations

from pathlib import Path

from casfs.csi.proto import csi_pb2
from casfs.csi.proto.regen import GENERATED, PROTOS
from casfs.grpcsvc.regen import generate, stale


def test_the_checked_in_modules_are_what_the_proto_generates(tmp_path: Path) -> None:
    assert [p.name for p in generate(PROTOS, tmp_path / "names")] == list(GENERATED)
    differ = stale(PROTOS, tmp_path / "fresh")
    assert differ == [], f"regenerate with `python -m casfs.csi.proto.regen`: {differ} differ"


def test_a_few_field_numbers_are_the_specs() -> None:
    """Spot checks against the CSI v1 spec (the whole file was checked against it when
    written): the package, and fields kubelet and the provisioner send on every call."""
    assert csi_pb2.DESCRIPTOR.package == "csi.v1"
    fields = {
        ("CreateVolumeRequest", "volume_content_source"): 6,
        ("CreateVolumeRequest", "accessibility_requirements"): 7,
        ("Volume", "accessible_topology"): 5,
        ("NodePublishVolumeRequest", "target_path"): 4,
        ("NodePublishVolumeRequest", "readonly"): 6,
        ("NodeStageVolumeRequest", "staging_target_path"): 3,
        ("GetPluginCapabilitiesResponse", "capabilities"): 1,
        ("NodeGetInfoResponse", "accessible_topology"): 3,
        ("Snapshot", "ready_to_use"): 5,
    }
    found = {(m, f): csi_pb2.DESCRIPTOR.message_types_by_name[m].fields_by_name[f].number for m, f in fields}
    assert found == fields
