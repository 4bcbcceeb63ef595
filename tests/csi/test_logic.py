"""The layer below the servicers, without a socket: the error table, the id scheme, the
in-progress lock, and a servicer called directly with a request."""

from __future__ import annotations

import errno
import sqlite3

import grpc
import pytest

from casfs import errors
from casfs.csi import codes, naming
from casfs.csi.controller import Controller
from casfs.csi.plugin import Plugin
from casfs.csi.proto import csi_pb2 as pb
from casfs.csi.server import volume_of
from casfs.grpcsvc.server import InProgress, socket_path
from casfs.repo import Repository
from tests.helpers.csi import mount_cap

Code = grpc.StatusCode


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.UsageError("x"), Code.INVALID_ARGUMENT),
        (errors.HostileArchive("x"), Code.INVALID_ARGUMENT),
        (codes.OutOfRange("x"), Code.OUT_OF_RANGE),
        (errors.NotFound("x"), Code.NOT_FOUND),
        (errors.Conflict("x"), Code.ALREADY_EXISTS),
        (codes.InUse("x"), Code.FAILED_PRECONDITION),
        (codes.Unmet("x"), Code.FAILED_PRECONDITION),
        (errors.ReadOnly("x"), Code.FAILED_PRECONDITION),
        (errors.Busy("x"), Code.ABORTED),
        (codes.Pending("x"), Code.ABORTED),
        (codes.BadToken("x"), Code.ABORTED),
        (codes.NoRoom("x"), Code.RESOURCE_EXHAUSTED),
        (OSError(errno.ENOSPC, "No space left on device"), Code.RESOURCE_EXHAUSTED),
        (sqlite3.OperationalError("database or disk is full"), Code.RESOURCE_EXHAUSTED),
        (errors.MissingBlob("x"), Code.INTERNAL),
        (errors.CasfsError("x"), Code.INTERNAL),
        (OSError(errno.EIO, "Input/output error"), Code.INTERNAL),
        (ValueError("x"), Code.INTERNAL),
    ],
)
def test_each_error_has_its_code(error: BaseException, code: Code) -> None:
    assert codes.status_of(error) == code


def test_a_message_is_one_line() -> None:
    assert codes.message_of(errors.Busy("a\n  b")) == "a b"
    assert (
        codes.message_of(OSError(errno.ENOSPC, "No space left on device", "/s/x"))
        == "No space left on device: /s/x"
    )


def test_volume_ids_are_the_name_when_casfs_can_use_it_else_a_stable_hash() -> None:
    assert (
        naming.volume_id("pvc-0a1b2c3d-aaaa-bbbb-cccc-0123456789ab")
        == "pvc-0a1b2c3d-aaaa-bbbb-cccc-0123456789ab"
    )
    odd = naming.volume_id("team/claim one")
    assert odd == naming.volume_id("team/claim one") and odd.startswith("csi-") and len(odd) == 52
    assert naming.volume_id("team/claim two") != odd
    with pytest.raises(errors.UsageError):
        naming.volume_id("")
    with pytest.raises(errors.UsageError):
        naming.volume_id("x" * 129)
    assert naming.known_volume("not a name") is None and naming.known_snapshot("v@0") is None
    assert naming.known_snapshot("v@3") == ("v", 3)


def test_the_in_progress_lock_refuses_a_second_holder_until_the_first_lets_go() -> None:
    locks = InProgress()
    with locks.hold("v"):
        with pytest.raises(codes.Pending, match="pending for volume 'v'"), locks.hold("v"):
            pass
        with locks.hold("w"):
            pass
    with locks.hold("v"):
        pass


def test_which_volume_an_rpc_is_about() -> None:
    assert volume_of("CreateVolume", pb.CreateVolumeRequest(name="pvc-1")) == "pvc-1"
    assert volume_of("CreateVolume", pb.CreateVolumeRequest()) == ""
    assert volume_of("DeleteSnapshot", pb.DeleteSnapshotRequest(snapshot_id="v@2")) == "v"
    assert volume_of("CreateSnapshot", pb.CreateSnapshotRequest(source_volume_id="v", name="s")) == "v"
    assert volume_of("NodeStageVolume", pb.NodeStageVolumeRequest(volume_id="v")) == "v"


def test_endpoints() -> None:
    assert socket_path("unix:///run/csi/csi.sock") == "/run/csi/csi.sock"
    assert socket_path("unix:/run/csi.sock") == "/run/csi.sock"
    for bad in ("tcp://1.2.3.4:5", "/run/csi.sock", "unix://relative"):
        with pytest.raises(errors.UsageError):
            socket_path(bad)


def test_a_servicer_is_plain_python_over_the_library(repo: Repository) -> None:
    controller = Controller(Plugin(repo, "node-1"))
    request = pb.CreateVolumeRequest(name="v", volume_capabilities=[mount_cap()])
    made = controller.CreateVolume(request)
    assert controller.CreateVolume(request) == made
    listed = controller.ListVolumes(pb.ListVolumesRequest())
    assert [e.volume.volume_id for e in listed.entries] == ["v"]
