"""containerd's snapshotter test suite (snapshots/testsuite, Go: it cannot run here),
its cases for the behaviours casfs serves, ported: driven through the snapshotter's gRPC
socket as containerd drives it, without containerd. Also the errors containerd tells
apart (errdefs: NotFound, AlreadyExists, FailedPrecondition, InvalidArgument), and
malformed requests."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from casfs.snapshotter.proto import snapshots_pb2 as pb
from casfs.snapshotter.proto import snapshots_pb2_grpc
from tests.helpers.fsck import fsck_clean
from tests.snapshotter.stack import Stack, running

Code = grpc.StatusCode


@pytest.fixture(scope="module")
def sn() -> Iterator[Stack]:
    with running(containerd=False) as s:
        yield s
        s.stop_all()
        fsck_clean(s.store)


@pytest.fixture
def rpc(sn: Stack) -> Iterator[snapshots_pb2_grpc.SnapshotsStub]:
    channel = grpc.insecure_channel(f"unix://{sn.socket}")
    yield snapshots_pb2_grpc.SnapshotsStub(channel)
    channel.close()


def prepare(rpc: snapshots_pb2_grpc.SnapshotsStub, key: str, parent: str = "", **labels: str) -> str:
    """The path the runtime would bind (the one Mount casfs returns)."""
    mounts = rpc.Prepare(pb.PrepareSnapshotRequest(key=key, parent=parent, labels=labels)).mounts
    assert [(m.type, list(m.options)[-1]) for m in mounts] == [("bind", "rw")]
    return str(mounts[0].source)


def commit(rpc: snapshots_pb2_grpc.SnapshotsStub, name: str, key: str) -> None:
    rpc.Commit(pb.CommitSnapshotRequest(name=name, key=key))


def remove(rpc: snapshots_pb2_grpc.SnapshotsStub, *keys: str) -> None:
    for key in keys:
        rpc.Remove(pb.RemoveSnapshotRequest(key=key))


def code_of(call: object, request: object) -> Code:
    with pytest.raises(grpc.RpcError) as e:
        call(request)  # type: ignore[operator]
    return e.value.code()


def stat(rpc: snapshots_pb2_grpc.SnapshotsStub, key: str) -> pb.Info:
    return rpc.Stat(pb.StatSnapshotRequest(key=key)).info


def test_basic_prepare_commit_and_a_child_sees_its_parent(rpc: snapshots_pb2_grpc.SnapshotsStub) -> None:
    """testsuite checkSnapshotterBasic."""
    root = Path(prepare(rpc, "basic-a"))
    (root / "foo").write_text("foo\n")
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "c").write_text("abc\n")
    commit(rpc, "basic-c", "basic-a")
    assert stat(rpc, "basic-c").kind == pb.COMMITTED
    assert code_of(rpc.Stat, pb.StatSnapshotRequest(key="basic-a")) == Code.NOT_FOUND  # (the active is gone)
    child = Path(prepare(rpc, "basic-b", "basic-c"))
    assert (child / "foo").read_text() == "foo\n" and (child / "a" / "b" / "c").read_text() == "abc\n"
    (child / "bar").write_text("bar\n")
    (child / "foo").unlink()
    commit(rpc, "basic-d", "basic-b")
    info = stat(rpc, "basic-d")
    assert (info.parent, info.kind) == ("basic-c", pb.COMMITTED)
    view = Path(rpc.View(pb.ViewSnapshotRequest(key="basic-v", parent="basic-d")).mounts[0].source)
    assert sorted(os.listdir(view)) == ["a", "bar"]  # (a file deleted in a layer is gone above it)
    remove(rpc, "basic-v", "basic-d", "basic-c")


def test_stat_of_active_and_committed(rpc: snapshots_pb2_grpc.SnapshotsStub) -> None:
    """testsuite checkSnapshotterStatActive, checkSnapshotterStatCommitted."""
    prepare(rpc, "stat-a", l1="v1")
    info = stat(rpc, "stat-a")
    assert (info.name, info.parent, info.kind, dict(info.labels)) == ("stat-a", "", pb.ACTIVE, {"l1": "v1"})
    assert info.created_at.seconds > 0 and info.updated_at.ToNanoseconds() >= info.created_at.ToNanoseconds()
    commit(rpc, "stat-c", "stat-a")
    assert stat(rpc, "stat-c").kind == pb.COMMITTED
    remove(rpc, "stat-c")


def test_transitivity_across_three_layers(rpc: snapshots_pb2_grpc.SnapshotsStub) -> None:
    """testsuite checkSnapshotterTransitivity, checkFileFromLowerLayer, checkLayerFileUpdate."""
    a = Path(prepare(rpc, "tr-a"))
    (a / "f").write_text("1")
    (a / "low").write_text("low")
    commit(rpc, "tr-1", "tr-a")
    b = Path(prepare(rpc, "tr-b", "tr-1"))
    (b / "f").write_text("2")
    commit(rpc, "tr-2", "tr-b")
    c = Path(prepare(rpc, "tr-c", "tr-2"))
    assert (c / "f").read_text() == "2" and (c / "low").read_text() == "low"
    remove(rpc, "tr-c", "tr-2", "tr-1")


def test_a_view_is_read_only_and_a_view_has_no_children(rpc: snapshots_pb2_grpc.SnapshotsStub) -> None:
    """testsuite checkSnapshotterViewReadonly, checkSnapshotPrepareView."""
    Path(prepare(rpc, "vw-a"), "x").write_text("x")
    commit(rpc, "vw-c", "vw-a")
    mounts = rpc.View(pb.ViewSnapshotRequest(key="vw-v", parent="vw-c")).mounts
    assert list(mounts[0].options)[-1] == "ro" and stat(rpc, "vw-v").kind == pb.VIEW
    with pytest.raises(OSError):
        Path(mounts[0].source, "y").write_text("y")
    assert rpc.Mounts(pb.MountsRequest(key="vw-v")).mounts == mounts
    # a parent must be committed: a view's or an active's children are refused
    assert (
        code_of(rpc.Prepare, pb.PrepareSnapshotRequest(key="vw-x", parent="vw-v")) == Code.FAILED_PRECONDITION
    )
    prepare(rpc, "vw-act")
    assert code_of(rpc.View, pb.ViewSnapshotRequest(key="vw-y", parent="vw-act")) == Code.FAILED_PRECONDITION
    # a view is not committed
    assert code_of(rpc.Commit, pb.CommitSnapshotRequest(name="vw-n", key="vw-v")) == Code.FAILED_PRECONDITION
    remove(rpc, "vw-v", "vw-act", "vw-c")


def test_remove_of_a_snapshot_with_children_is_refused(rpc: snapshots_pb2_grpc.SnapshotsStub) -> None:
    """testsuite checkRemoveIntermediateSnapshot."""
    prepare(rpc, "ri-a")
    commit(rpc, "ri-base", "ri-a")
    prepare(rpc, "ri-b", "ri-base")
    commit(rpc, "ri-top", "ri-b")
    assert code_of(rpc.Remove, pb.RemoveSnapshotRequest(key="ri-base")) == Code.FAILED_PRECONDITION
    assert stat(rpc, "ri-base").kind == pb.COMMITTED  # (refused: nothing changed)
    remove(rpc, "ri-top", "ri-base")
    assert code_of(rpc.Stat, pb.StatSnapshotRequest(key="ri-base")) == Code.NOT_FOUND


def test_update_changes_labels_only(rpc: snapshots_pb2_grpc.SnapshotsStub) -> None:
    """testsuite checkUpdate."""
    prepare(rpc, "up-a", keep="1", drop="2")
    before = stat(rpc, "up-a")
    info = pb.Info(name="up-a", labels={"keep": "1", "new": "3"})
    got = rpc.Update(pb.UpdateSnapshotRequest(info=info)).info
    assert dict(got.labels) == {"keep": "1", "new": "3"} and got.created_at == before.created_at
    mask = pb.UpdateSnapshotRequest(info=pb.Info(name="up-a", labels={"only": "4"}))
    mask.update_mask.paths.append("labels.only")
    mask.update_mask.paths.append("labels.keep")  # (named, absent from the labels: removed)
    assert dict(rpc.Update(mask).info.labels) == {"new": "3", "only": "4"}
    bad = pb.UpdateSnapshotRequest(info=pb.Info(name="up-a", parent="other"))
    bad.update_mask.paths.append("parent")
    assert code_of(rpc.Update, bad) == Code.INVALID_ARGUMENT
    assert code_of(rpc.Update, pb.UpdateSnapshotRequest(info=pb.Info(name="up-none"))) == Code.NOT_FOUND
    remove(rpc, "up-a")


def test_list_and_usage(rpc: snapshots_pb2_grpc.SnapshotsStub) -> None:
    """testsuite checkStatInWalk; Usage counts what the snapshot alone holds."""
    root = Path(prepare(rpc, "us-a"))
    (root / "data").write_bytes(os.urandom(300_000))
    subprocess.run(["sync", "-f", str(root / "data")], check=True)
    listed = {i.name: i for r in rpc.List(pb.ListSnapshotsRequest()) for i in r.info}
    assert listed["us-a"] == stat(rpc, "us-a")
    commit(rpc, "us-c", "us-a")
    usage = rpc.Usage(pb.UsageRequest(key="us-c"))
    assert usage.size >= 300_000 and usage.inodes == 2  # (the root and the file)
    remove(rpc, "us-c")


def listed(rpc: snapshots_pb2_grpc.SnapshotsStub, *filters: str) -> list[str]:
    return sorted(i.name for r in rpc.List(pb.ListSnapshotsRequest(filters=filters)) for i in r.info)


def test_list_filters_in_containerd_syntax(rpc: snapshots_pb2_grpc.SnapshotsStub) -> None:
    """testsuite's Walk with filters (containerd's filters package: OR of filters, AND
    of a filter's selectors); what the service cannot filter by is InvalidArgument."""
    prepare(rpc, "lf-a")
    rpc.Commit(pb.CommitSnapshotRequest(name="lf-base", key="lf-a", labels={"app.x": "1", "tier": "base"}))
    prepare(rpc, "lf-b", "lf-base", tier="top")
    rpc.View(pb.ViewSnapshotRequest(key="lf-v", parent="lf-base", labels={"tier": "view"}))
    mine = ["lf-b", "lf-base", "lf-v"]
    assert [n for n in listed(rpc) if n.startswith("lf-")] == mine
    assert listed(rpc, 'labels."app.x"==1') == listed(rpc, 'labels."app.x"') == ["lf-base"]
    assert listed(rpc, "parent==lf-base") == ["lf-b", "lf-v"]
    assert "lf-base" in listed(rpc, 'parent==""') and "lf-b" not in listed(rpc, 'parent==""')
    assert listed(rpc, "kind==view") == ["lf-v"] and listed(rpc, "kind==committed,name~=^lf-") == ["lf-base"]
    assert listed(rpc, "labels.tier==top", "labels.tier==view") == ["lf-b", "lf-v"]  # (OR)
    assert listed(rpc, "labels.tier==top,parent==lf-base") == ["lf-b"]  # (AND)
    assert listed(rpc, "name~=/^lf-[bv]$/") == ["lf-b", "lf-v"]
    assert [n for n in listed(rpc, "parent!=lf-base") if n.startswith("lf-")] == ["lf-base"]
    assert listed(rpc, "labels.tier,name~=lf-") == mine  # (present)
    for bad in ("size==1", "labels", "name==", "name~=(", 'labels."open==1', "name==a b,,", "kind=view"):
        every = lambda request: list(rpc.List(request))  # noqa: E731 (a stream: its status comes as it is read)
        assert code_of(every, pb.ListSnapshotsRequest(filters=[bad])) == Code.INVALID_ARGUMENT, bad
    remove(rpc, "lf-b", "lf-v", "lf-base")


def test_the_errors_containerd_tells_apart(rpc: snapshots_pb2_grpc.SnapshotsStub) -> None:
    prepare(rpc, "er-a")
    assert code_of(rpc.Prepare, pb.PrepareSnapshotRequest(key="er-a")) == Code.ALREADY_EXISTS
    assert code_of(rpc.Stat, pb.StatSnapshotRequest(key="er-none")) == Code.NOT_FOUND
    assert code_of(rpc.Mounts, pb.MountsRequest(key="er-none")) == Code.NOT_FOUND
    assert code_of(rpc.Remove, pb.RemoveSnapshotRequest(key="er-none")) == Code.NOT_FOUND
    assert code_of(rpc.Usage, pb.UsageRequest(key="er-none")) == Code.NOT_FOUND
    assert code_of(rpc.Prepare, pb.PrepareSnapshotRequest(key="er-b", parent="er-none")) == Code.NOT_FOUND
    assert code_of(rpc.Commit, pb.CommitSnapshotRequest(name="er-n", key="er-none")) == Code.NOT_FOUND
    commit(rpc, "er-c", "er-a")
    prepare(rpc, "er-d")
    assert code_of(rpc.Commit, pb.CommitSnapshotRequest(name="er-c", key="er-d")) == Code.ALREADY_EXISTS
    assert stat(rpc, "er-d").kind == pb.ACTIVE  # (the refused commit changed nothing)
    assert code_of(rpc.Mounts, pb.MountsRequest(key="er-c")) == Code.FAILED_PRECONDITION
    remove(rpc, "er-d", "er-c")


def test_a_snapshot_mounted_elsewhere_is_neither_committed_nor_removed(
    rpc: snapshots_pb2_grpc.SnapshotsStub, tmp_path: Path
) -> None:
    """A running container's rootfs is a bind of the snapshot's mount: unmounting under
    it would wait for the container, so the commit or removal is refused."""
    source = prepare(rpc, "bound")
    target = tmp_path / "rootfs"
    target.mkdir()
    subprocess.run(["mount", "--bind", source, str(target)], check=True)
    try:
        assert (
            code_of(rpc.Commit, pb.CommitSnapshotRequest(name="bound-c", key="bound"))
            == Code.FAILED_PRECONDITION
        )
        assert code_of(rpc.Remove, pb.RemoveSnapshotRequest(key="bound")) == Code.FAILED_PRECONDITION
        assert stat(rpc, "bound").kind == pb.ACTIVE
    finally:
        subprocess.run(["umount", str(target)], check=True)
    commit(rpc, "bound-c", "bound")
    remove(rpc, "bound-c")


def test_one_store_mount_serves_every_snapshot_and_a_dead_one_is_restarted(
    rpc: snapshots_pb2_grpc.SnapshotsStub, sn: Stack
) -> None:
    """Prepares, a commit and a removal start no daemon; the store mount's daemon killed,
    the next Mounts starts another, and what was made durable before is there."""
    a, b = Path(prepare(rpc, "dd-a")), Path(prepare(rpc, "dd-b"))
    pid = sn.store_daemon()
    assert pid is not None and a.parent == b.parent == sn.store_mount / "volumes"
    with open(a / "f", "w") as f:
        f.write("kept")
        f.flush()
        os.fsync(f.fileno())
    commit(rpc, "dd-c", "dd-b")
    assert sn.store_daemon() == pid
    os.kill(pid, signal.SIGKILL)
    sn.wait("the daemon gone", lambda: sn.store_daemon() is None)
    again = Path(rpc.Mounts(pb.MountsRequest(key="dd-a")).mounts[0].source)
    assert sn.store_daemon() not in (None, pid)
    assert (again / "f").read_text() == "kept"
    (again / "g").write_text("after")
    commit(rpc, "dd-ac", "dd-a")
    child = Path(prepare(rpc, "dd-child", "dd-ac"))
    assert sorted(os.listdir(child)) == ["f", "g"]
    remove(rpc, "dd-child", "dd-ac", "dd-c")


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        ("Prepare", pb.PrepareSnapshotRequest(key="")),
        ("View", pb.ViewSnapshotRequest(key="")),
        ("Prepare", pb.PrepareSnapshotRequest(key="x" * 5000)),
        ("Prepare", pb.PrepareSnapshotRequest(key="nul\0key")),
        ("Prepare", pb.PrepareSnapshotRequest(key="lbl", labels={"": "v"})),
        ("Commit", pb.CommitSnapshotRequest(name="", key="k")),
        ("Commit", pb.CommitSnapshotRequest(name="n", key="")),
        ("Commit", pb.CommitSnapshotRequest(name="n", key="k", parent="rebase")),
        ("Stat", pb.StatSnapshotRequest(key="")),
        ("Remove", pb.RemoveSnapshotRequest(key="")),
        ("Mounts", pb.MountsRequest(key="")),
        ("Usage", pb.UsageRequest(key="")),
        ("Update", pb.UpdateSnapshotRequest()),
    ],
)
def test_malformed_requests_are_invalid_argument(
    rpc: snapshots_pb2_grpc.SnapshotsStub, sn: Stack, method: str, request_: object
) -> None:
    before = sn.records()
    assert code_of(getattr(rpc, method), request_) == Code.INVALID_ARGUMENT
    assert sn.records() == before


def test_a_prepare_of_a_chain_casfs_does_not_hold_is_an_ordinary_prepare(
    rpc: snapshots_pb2_grpc.SnapshotsStub,
) -> None:
    """The remote-snapshot label for a chain no image of the store keeps: containerd
    unpacks into the new snapshot as for any snapshotter."""
    chain = "sha256:" + "ab" * 32
    prepare(rpc, "rs-a", **{"containerd.io/snapshot.ref": chain})
    assert stat(rpc, "rs-a").kind == pb.ACTIVE
    names = {i.name for r in rpc.List(pb.ListSnapshotsRequest()) for i in r.info}
    assert not any(n.startswith("casfs-chain/") for n in names)
    remove(rpc, "rs-a")
