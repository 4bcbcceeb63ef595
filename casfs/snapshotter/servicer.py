"""The Snapshots service: each RPC decodes its request, calls the Snapshotter
(service.py) and encodes the answer. Errors are casfs's, mapped to containerd's codes
by casfs.grpcsvc.codes (NotFound, AlreadyExists, FailedPrecondition, InvalidArgument)."""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf import empty_pb2, timestamp_pb2

from casfs.errors import UsageError
from casfs.snapshotter.filters import compile_filters
from casfs.snapshotter.proto import mount_pb2
from casfs.snapshotter.proto import snapshots_pb2 as pb
from casfs.snapshotter.records import Record
from casfs.snapshotter.service import Snapshotter

KINDS = {"view": pb.VIEW, "active": pb.ACTIVE, "committed": pb.COMMITTED}


def bind(path: str, read_only: bool) -> list[mount_pb2.Mount]:
    """What the runtime mounts: a bind of the snapshot's casfs mount."""
    return [mount_pb2.Mount(type="bind", source=path, options=["rbind", "ro" if read_only else "rw"])]


def info(rec: Record) -> pb.Info:
    def ts(t: float) -> timestamp_pb2.Timestamp:
        out = timestamp_pb2.Timestamp()
        out.FromNanoseconds(int(t * 1e9))
        return out

    return pb.Info(
        name=rec.key,
        parent=rec.parent,
        kind=KINDS[rec.kind],
        created_at=ts(rec.created),
        updated_at=ts(rec.updated),
        labels=rec.labels,
    )


class Snapshots:
    def __init__(self, snapshotter: Snapshotter) -> None:
        self.sn = snapshotter

    def Prepare(self, request: pb.PrepareSnapshotRequest) -> pb.PrepareSnapshotResponse:
        path = self.sn.prepare(request.key, request.parent, dict(request.labels))
        return pb.PrepareSnapshotResponse(mounts=bind(path, False))

    def View(self, request: pb.ViewSnapshotRequest) -> pb.ViewSnapshotResponse:
        path = self.sn.prepare(request.key, request.parent, dict(request.labels), read_only=True)
        return pb.ViewSnapshotResponse(mounts=bind(path, True))

    def Mounts(self, request: pb.MountsRequest) -> pb.MountsResponse:
        path, read_only = self.sn.mounts_of(request.key)
        return pb.MountsResponse(mounts=bind(path, read_only))

    def Commit(self, request: pb.CommitSnapshotRequest) -> empty_pb2.Empty:
        if request.parent:
            raise UsageError("a commit onto another parent (a rebase) is not supported")
        self.sn.commit(request.name, request.key, dict(request.labels))
        return empty_pb2.Empty()

    def Remove(self, request: pb.RemoveSnapshotRequest) -> empty_pb2.Empty:
        self.sn.remove(request.key)
        return empty_pb2.Empty()

    def Stat(self, request: pb.StatSnapshotRequest) -> pb.StatSnapshotResponse:
        return pb.StatSnapshotResponse(info=info(self.sn.stat(request.key)))

    def Update(self, request: pb.UpdateSnapshotRequest) -> pb.UpdateSnapshotResponse:
        paths = list(request.update_mask.paths)
        rec = self.sn.update(request.info.name, dict(request.info.labels), paths)
        return pb.UpdateSnapshotResponse(info=info(rec))

    def List(self, request: pb.ListSnapshotsRequest) -> Iterator[pb.ListSnapshotsResponse]:
        """Those any filter matches (filters.py), in pages of 100. Read whole first, so
        that an error is the RPC's status, not a broken stream."""
        found = [info(r) for r in self.sn.listing(compile_filters(list(request.filters)))]
        return iter([pb.ListSnapshotsResponse(info=found[i : i + 100]) for i in range(0, len(found), 100)])

    def Usage(self, request: pb.UsageRequest) -> pb.UsageResponse:
        size, inodes = self.sn.usage(request.key)
        return pb.UsageResponse(size=size, inodes=inodes)

    def Cleanup(self, request: pb.CleanupRequest) -> empty_pb2.Empty:
        self.sn.cleanup()
        return empty_pb2.Empty()
