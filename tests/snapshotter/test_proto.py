"""The checked-in snapshotter modules are what their .proto files generate, and speak
containerd's wire names and numbers (a renumbered field would be garbage to containerd)."""

from __future__ import annotations

from pathlib import Path

from casfs.grpcsvc.regen import stale
from casfs.snapshotter.proto import leases_pb2, mount_pb2
from casfs.snapshotter.proto import snapshots_pb2 as pb
from casfs.snapshotter.proto.regen import PROTOS


def test_the_checked_in_modules_are_what_the_protos_generate(tmp_path: Path) -> None:
    differ = stale(PROTOS, tmp_path)
    assert differ == [], f"regenerate with `python -m casfs.snapshotter.proto.regen`: {differ} differ"


def test_names_and_field_numbers_are_containerds() -> None:
    """Spot checks against containerd's api/ (the files were written from it)."""
    assert pb.DESCRIPTOR.package == "containerd.services.snapshots.v1"
    assert (
        pb.DESCRIPTOR.services_by_name["Snapshots"].full_name == "containerd.services.snapshots.v1.Snapshots"
    )
    assert mount_pb2.Mount.DESCRIPTOR.full_name == "containerd.types.Mount"
    assert (
        leases_pb2.DESCRIPTOR.services_by_name["Leases"].full_name == "containerd.services.leases.v1.Leases"
    )
    fields = {
        ("PrepareSnapshotRequest", "labels"): 4,
        ("CommitSnapshotRequest", "parent"): 5,
        ("Info", "labels"): 6,
        ("Info", "updated_at"): 5,
        ("UpdateSnapshotRequest", "update_mask"): 3,
        ("UsageResponse", "inodes"): 2,
    }
    found = {(m, f): pb.DESCRIPTOR.message_types_by_name[m].fields_by_name[f].number for m, f in fields}
    assert found == fields
    assert [f.number for f in mount_pb2.Mount.DESCRIPTOR.fields] == [1, 2, 3, 4]
    assert leases_pb2.CreateRequest.DESCRIPTOR.fields_by_name["labels"].number == 3
    assert dict(pb.Kind.items()) == {"UNKNOWN": 0, "VIEW": 1, "ACTIVE": 2, "COMMITTED": 3}
