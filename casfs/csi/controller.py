"""The Controller service: volumes and snapshots at rest, in this node's store.

Every create is idempotent by name: the volume id is a function of the name
(naming.py), the request is kept beside the catalog (records.py), and a repeat with a
compatible request returns the volume as it is, without doing the work again. A clone
costs one reference whatever the size: from a snapshot, a clone of `VOL@N`; from a
volume, a clone of a snapshot taken for it (labelled `csi-clone:<new id>`, so that a
repeat after a crash reuses it).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from google.protobuf import timestamp_pb2, wrappers_pb2

from casfs import volumes
from casfs.catalog import volumes as volume_rows
from casfs.csi import capabilities, figures, naming, records
from casfs.csi.codes import BadToken, InUse, NoRoom, OutOfRange, Pending
from casfs.csi.health import condition
from casfs.csi.plugin import Plugin
from casfs.csi.proto import csi_pb2 as pb
from casfs.errors import Conflict, NotFound, UsageError
from casfs.ids import SnapshotNo
from casfs.kinds import MAX_BLOCK_SIZE, VolumeKind, block_size_refusal
from casfs.lifecycle import pids
from casfs.lifecycle.phases import VOLUME_HELD, VolumePhase
from casfs.repo import Repository
from casfs.units import parse_size

log = logging.getLogger("casfs.csi")
DEFAULT_BLOCK_BYTES = 1 << 30  # a block volume asked without a capacity
PARAMETERS = ("kind", "image", "chunkSize")
# Keys the external-provisioner adds (--extra-create-metadata): not the volume's spec.
METADATA_PREFIX = "csi.storage.k8s.io/"
Rpc = pb.ControllerServiceCapability.RPC
CAPABILITIES = (
    Rpc.CREATE_DELETE_VOLUME,
    Rpc.LIST_VOLUMES,
    Rpc.GET_CAPACITY,
    Rpc.CREATE_DELETE_SNAPSHOT,
    Rpc.LIST_SNAPSHOTS,
    Rpc.CLONE_VOLUME,
    Rpc.EXPAND_VOLUME,
    Rpc.LIST_VOLUMES_PUBLISHED_NODES,
    Rpc.VOLUME_CONDITION,
    Rpc.GET_VOLUME,
    Rpc.SINGLE_NODE_MULTI_WRITER,
)


class Controller:
    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin

    @property
    def repo(self) -> Repository:
        return self.plugin.repo

    # -- volumes ----------------------------------------------------------------------

    def CreateVolume(self, request: pb.CreateVolumeRequest) -> pb.CreateVolumeResponse:
        vid = naming.volume_id(request.name)
        caps = capabilities.require(request.volume_capabilities)
        if not self.plugin.reachable(request.accessibility_requirements):
            raise NoRoom(f"a volume here is on node {self.plugin.node_id!r} only, which the request excludes")
        want = _request_record(request)
        info = self._settled(vid)
        had = records.read(self.plugin.store, vid) if info is not None else None
        if info is not None and had is not None and had.get("created") == info.created:
            return self._repeat(info, had, want, caps, request)
        # (a record of another volume of that name, deleted and made again by the CLI: not this one's)
        # A new volume, or one whose record a crash lost (kept without an fsync:
        # records.py): casfs's own create is idempotent by spec, so a repeat of the
        # request that made it returns it, and another request is ALREADY_EXISTS.
        kind, source, size = self._plan(vid, want, caps)
        want["kind"] = kind.value
        want["capacity"] = size if kind == VolumeKind.BLOCK else want["required"]
        chunk = want["params"].get("chunkSize")
        blank = source.blank_dir or source.blank_block is not None
        try:
            made, _ = volumes.create_volume(
                self.repo, vid, source, chunk_size=parse_size(chunk) if chunk and blank else None
            )
        except Conflict:
            raise Conflict(
                f"volume {vid!r} exists with another spec (made by `casfs volume create`?)"
            ) from None
        want["created"] = made.created  # (which volume of that name the record is of)
        records.write(self.plugin.store, vid, want)
        return pb.CreateVolumeResponse(volume=self._volume(self._finish(vid, want), want))

    def _settled(self, vid: str, recovered: bool = False) -> volumes.VolumeInfo | None:
        """The volume, if any, once no other process is creating or deleting it: a live
        one's phase is the lock (ABORTED). A phase whose process died (a create, a
        delete, a mount whose daemon was killed) is recovered first, as every casfs
        command does at its start."""
        try:
            info = volumes.get_volume(self.repo, vid)
        except NotFound:
            return None
        if info.phase not in VOLUME_HELD:
            return info
        if not recovered and not pids.alive(info.owner_pid):
            from casfs.upkeep.recovery import recover

            for message in recover(self.repo):
                log.info("recovered: %s", message)
            return self._settled(vid, recovered=True)
        if info.phase in (VolumePhase.CREATING, VolumePhase.DELETING):
            raise Pending(
                f"volume {vid!r} is being {info.phase.removesuffix('ing')}ed by process {info.owner_pid}"
            )
        return info

    def _repeat(
        self,
        info: volumes.VolumeInfo,
        had: dict[str, Any],
        want: dict[str, Any],
        caps: list[pb.VolumeCapability],
        request: pb.CreateVolumeRequest,
    ) -> pb.CreateVolumeResponse:
        """The volume exists: the same volume if the request is compatible, else ALREADY_EXISTS."""
        same = had.get("params") == want["params"] and had.get("source") == want["source"]
        capacity = int(had.get("capacity", 0))
        fits = capacity >= want["required"] and (not want["limit"] or capacity <= want["limit"])
        why = next((w for c in caps if (w := capabilities.refusal(c, info.kind))), None)
        if not same or not fits or why:
            raise Conflict(f"volume {request.name!r} exists with another spec" + (f" ({why})" if why else ""))
        return pb.CreateVolumeResponse(volume=self._volume(self._finish(info.name, had), had))

    def _plan(
        self, vid: str, want: dict[str, Any], caps: list[pb.VolumeCapability]
    ) -> tuple[VolumeKind, volumes.Source, int]:
        """The new volume's kind, casfs source and size (a block volume's; 0 for a directory)."""
        params, src = want["params"], want["source"]
        chunk = parse_size(params["chunkSize"]) if "chunkSize" in params else None
        if "snapshot" in src:
            ref = naming.known_snapshot(src["snapshot"])
            snap = self._snapshot_info(ref) if ref else None
            if snap is None or ref is None:
                raise NotFound(f"no snapshot {src['snapshot']!r}")
            kind = volumes.get_volume(self.repo, ref[0]).kind
            source, size = volumes.Source(snapshot=naming.snapshot_id(*ref)), snap.size
        elif "volume" in src:
            name = naming.known_volume(src["volume"])
            if name is None:
                raise NotFound(f"no volume {src['volume']!r}")
            origin = volumes.get_volume(self.repo, name)
            _check_kind(params, origin.kind)
            capabilities.check(caps, origin.kind)  # (before the snapshot it is cloned from)
            ref = self._clone_snapshot(origin, vid)
            kind, source, size = origin.kind, volumes.Source(snapshot=naming.snapshot_id(*ref)), origin.size
        elif "image" in params:
            from casfs import images

            image = images.get_image(self.repo, params["image"])
            kind, source, size = image.kind, volumes.Source(image=params["image"]), image.size
        else:
            kind = VolumeKind(params.get("kind") or (capabilities.kind_asked(caps) or VolumeKind.DIR).value)
            size = _block_size(want["required"], chunk or kind.default_chunk_size)
            blank = (
                volumes.Source(blank_block=size)
                if kind == VolumeKind.BLOCK
                else volumes.Source(blank_dir=True)
            )
            source = blank
        _check_kind(params, kind)
        capabilities.check(caps, kind)
        if kind == VolumeKind.BLOCK:
            if want["required"]:  # (a clone asked for no size keeps its source's)
                size = max(size, _block_size(want["required"], chunk or kind.default_chunk_size))
            _check_block_capacity(size, want["limit"])
        return kind, source, size if kind == VolumeKind.BLOCK else 0

    def _finish(self, vid: str, record: dict[str, Any]) -> volumes.VolumeInfo:
        """A block volume cloned smaller than its asked capacity is grown to it (again,
        after a crash between the clone and the resize)."""
        info = volumes.get_volume(self.repo, vid)
        capacity = int(record.get("capacity", 0))
        if info.kind == VolumeKind.BLOCK and info.size < capacity and info.phase == VolumePhase.READY:
            volumes.resize(self.repo, vid, _block_size(capacity, info.chunk_size))
            info = volumes.get_volume(self.repo, vid)
        return info

    def _clone_snapshot(self, origin: volumes.VolumeInfo, vid: str) -> tuple[str, SnapshotNo]:
        """The snapshot of `origin` that volume `vid` is cloned from: the one taken for it
        already (a repeat), else a new one of its newest state (live if it is mounted)."""
        label = naming.CLONE_LABEL_PREFIX + vid
        found = self._labelled(label, origin.name)
        return found if found is not None else self._snapshot(origin, label)

    def DeleteVolume(self, request: pb.DeleteVolumeRequest) -> pb.DeleteVolumeResponse:
        name = naming.known_volume(_required(request.volume_id, "a volume id"))
        if name is None:
            return pb.DeleteVolumeResponse()  # (no volume can have that id: deleted, as asked)
        info = self._settled(name)
        if info is None:
            records.remove(self.plugin.store, name)
            return pb.DeleteVolumeResponse()
        staged = self._staged_at(info)
        if staged is not None:
            raise InUse(f"volume {name!r} is staged at {staged}: unstage it first")
        users = volume_rows.made_from_snapshots_of(self.repo.conn, name)
        if users:
            raise InUse(f"volume {name!r} has snapshots that volume(s) {', '.join(users)} were made from")
        record = records.read(self.plugin.store, name) or {}
        volumes.remove_volume(self.repo, name, if_exists=True)
        self._drop_clone_snapshot(name, record)
        records.remove(self.plugin.store, name)
        return pb.DeleteVolumeResponse()

    def _drop_clone_snapshot(self, vid: str, record: dict[str, Any]) -> None:
        """The snapshot a clone of a volume was made through is CSI's own: gone with the clone."""
        origin = naming.known_volume(str(record.get("source", {}).get("volume", "")))
        found = self._labelled(naming.CLONE_LABEL_PREFIX + vid, origin) if origin else None
        if found is not None and not volume_rows.made_from(
            self.repo.conn, "snapshot:" + naming.snapshot_id(*found)
        ):
            volumes.remove_snapshot(self.repo, naming.snapshot_id(*found), if_exists=True)

    def ValidateVolumeCapabilities(
        self, request: pb.ValidateVolumeCapabilitiesRequest
    ) -> pb.ValidateVolumeCapabilitiesResponse:
        info = self._volume_info(request.volume_id)
        caps = capabilities.require(request.volume_capabilities)
        why = next((w for c in caps if (w := capabilities.refusal(c, info.kind))), None)
        if why is not None:
            return pb.ValidateVolumeCapabilitiesResponse(message=why)
        confirmed = pb.ValidateVolumeCapabilitiesResponse.Confirmed(
            volume_context=request.volume_context, volume_capabilities=caps, parameters=request.parameters
        )
        return pb.ValidateVolumeCapabilitiesResponse(confirmed=confirmed)

    def ListVolumes(self, request: pb.ListVolumesRequest) -> pb.ListVolumesResponse:
        after = _token(request.starting_token, "v")
        infos = sorted(
            (
                i
                for i in volumes.list_volumes(self.repo)
                if i.name > after and i.phase != VolumePhase.DELETING
            ),
            key=lambda i: i.name,
        )
        page, more = _page(infos, request.max_entries)
        Entry, Status = pb.ListVolumesResponse.Entry, pb.ListVolumesResponse.VolumeStatus
        entries = [
            Entry(
                volume=self._volume(i, records.read(self.plugin.store, i.name) or {}),
                status=Status(
                    published_node_ids=self._published(i), volume_condition=condition(self.plugin, i)
                ),
            )
            for i in page
        ]
        return pb.ListVolumesResponse(entries=entries, next_token="v:" + page[-1].name if more else "")

    def ControllerGetVolume(self, request: pb.ControllerGetVolumeRequest) -> pb.ControllerGetVolumeResponse:
        info = self._volume_info(request.volume_id)
        status = pb.ControllerGetVolumeResponse.VolumeStatus(
            published_node_ids=self._published(info), volume_condition=condition(self.plugin, info)
        )
        record = records.read(self.plugin.store, info.name) or {}
        return pb.ControllerGetVolumeResponse(volume=self._volume(info, record), status=status)

    def GetCapacity(self, request: pb.GetCapacityRequest) -> pb.GetCapacityResponse:
        """What the store's filesystem can still hold (0 where casfs cannot serve the request)."""
        asked = request.parameters.get("kind") or "dir"
        kind = VolumeKind(asked) if asked in ("dir", "block") else None
        here = not request.HasField("accessible_topology") or self.plugin.reachable(
            pb.TopologyRequirement(requisite=[request.accessible_topology])
        )
        served = (
            kind is not None
            and here
            and all(capabilities.refusal(c, kind) is None for c in request.volume_capabilities)
        )
        st = os.statvfs(self.plugin.store)
        available = st.f_bavail * st.f_frsize if served else 0
        biggest = MAX_BLOCK_SIZE if kind == VolumeKind.BLOCK else available
        return pb.GetCapacityResponse(
            available_capacity=available, maximum_volume_size=wrappers_pb2.Int64Value(value=biggest)
        )

    def ControllerGetCapabilities(
        self, request: pb.ControllerGetCapabilitiesRequest
    ) -> pb.ControllerGetCapabilitiesResponse:
        caps = [pb.ControllerServiceCapability(rpc=Rpc(type=t)) for t in CAPABILITIES]
        return pb.ControllerGetCapabilitiesResponse(capabilities=caps)

    def ControllerExpandVolume(
        self, request: pb.ControllerExpandVolumeRequest
    ) -> pb.ControllerExpandVolumeResponse:
        """A block volume grows at rest (offline expansion); a directory volume has no
        size to set: its recorded capacity is raised."""
        info = self._volume_info(request.volume_id)
        if not request.HasField("capacity_range"):
            raise UsageError("a capacity range is required")
        required, limit = _capacity(request.capacity_range)
        record = records.read(self.plugin.store, info.name) or {}
        if info.kind == VolumeKind.DIR:
            capacity = max(int(record.get("capacity", 0)), required)
        else:
            capacity = max(info.size, _block_size(required, info.chunk_size))
            _check_block_capacity(capacity, limit)
            if capacity > info.size:
                if self._staged_at(info) is not None:
                    raise InUse(f"volume {info.name!r} is staged: a block volume grows unstaged (offline)")
                volumes.resize(self.repo, info.name, capacity)
        if record and int(record.get("capacity", 0)) < capacity:
            records.write(self.plugin.store, info.name, {**record, "capacity": capacity}, durable=True)
        return pb.ControllerExpandVolumeResponse(capacity_bytes=capacity, node_expansion_required=False)

    # -- snapshots --------------------------------------------------------------------

    def CreateSnapshot(self, request: pb.CreateSnapshotRequest) -> pb.CreateSnapshotResponse:
        source = _required(request.source_volume_id, "a source volume id")
        label = naming.snapshot_label(request.name)
        found = self._labelled(label)
        if found is not None and found[0] != source:
            raise Conflict(f"snapshot {request.name!r} exists, of volume {found[0]!r}")
        if found is None:
            found = self._snapshot(self._volume_info(source), label)
        return pb.CreateSnapshotResponse(snapshot=self._snapshot_message(*found))

    def _snapshot(self, info: volumes.VolumeInfo, label: str) -> tuple[str, SnapshotNo]:
        """Take a snapshot of `info` labelled `label`: through its mount when it is
        staged (as setfattr does: the daemon holds its changes), else at rest."""
        mountpoint = self.plugin.mountpoint(info.name) if info.phase == VolumePhase.MOUNTED else None
        if mountpoint is None:
            return info.name, volumes.create_snapshot(self.repo, info.name, label)
        os.setxattr(mountpoint, "user.casfs.snapshot", label.encode())
        found = self._labelled(label, info.name)
        if found is None:
            raise NotFound(f"the snapshot of {info.name!r} taken through {mountpoint} is not in the catalog")
        return found

    def DeleteSnapshot(self, request: pb.DeleteSnapshotRequest) -> pb.DeleteSnapshotResponse:
        ref = naming.known_snapshot(_required(request.snapshot_id, "a snapshot id"))
        if ref is None:
            return pb.DeleteSnapshotResponse()
        sid = naming.snapshot_id(*ref)
        users = [v for v in volume_rows.made_from(self.repo.conn, "snapshot:" + sid) if v != ref[0]]
        if users:
            raise InUse(f"snapshot {sid} is in use by volume(s): {', '.join(users)}")
        with contextlib.suppress(NotFound):  # (its volume is gone: so is the snapshot)
            volumes.remove_snapshot(self.repo, sid, if_exists=True)
        return pb.DeleteSnapshotResponse()

    def ListSnapshots(self, request: pb.ListSnapshotsRequest) -> pb.ListSnapshotsResponse:
        after = _token(request.starting_token, "s")
        found = [s for s in self._all_snapshots(request) if _snapshot_key(s.volume, s.n) > after]
        found.sort(key=lambda s: _snapshot_key(s.volume, s.n))
        page, more = _page(found, request.max_entries)
        Entry = pb.ListSnapshotsResponse.Entry
        entries = [Entry(snapshot=self._snapshot_message(s.volume, s.n, s)) for s in page]
        next_token = "s:" + _snapshot_key(page[-1].volume, page[-1].n) if more else ""
        return pb.ListSnapshotsResponse(entries=entries, next_token=next_token)

    def _all_snapshots(self, request: pb.ListSnapshotsRequest) -> list[volumes.SnapshotInfo]:
        if request.snapshot_id:
            ref = naming.known_snapshot(request.snapshot_id)
            snap = self._snapshot_info(ref) if ref else None
            if snap is None or (request.source_volume_id and snap.volume != request.source_volume_id):
                return []
            return [snap]
        if request.source_volume_id:
            name = naming.known_volume(request.source_volume_id)
            return self._snapshots_of(name) if name else []
        return [s for i in volumes.list_volumes(self.repo) for s in self._snapshots_of(i.name)]

    # -- helpers ----------------------------------------------------------------------

    def _volume_info(self, volume_id: str) -> volumes.VolumeInfo:
        name = naming.known_volume(_required(volume_id, "a volume id"))
        info = self._settled(name) if name is not None else None
        if info is None:
            raise NotFound(f"no volume {volume_id!r}")
        return info

    def _volume(self, info: volumes.VolumeInfo, record: dict[str, Any]) -> pb.Volume:
        capacity = info.size if info.kind == VolumeKind.BLOCK else int(record.get("capacity", 0))
        source = record.get("source") or {}
        content = pb.VolumeContentSource()
        if "snapshot" in source:
            content.snapshot.snapshot_id = source["snapshot"]
        elif "volume" in source:
            content.volume.volume_id = source["volume"]
        return pb.Volume(
            capacity_bytes=capacity,
            volume_id=info.name,
            volume_context={"kind": info.kind.value},
            content_source=content if source else None,
            accessible_topology=[self.plugin.topology()],
        )

    def _published(self, info: volumes.VolumeInfo) -> list[str]:
        return [self.plugin.node_id] if self._staged_at(info) is not None else []

    def _staged_at(self, info: volumes.VolumeInfo) -> str | None:
        """Where the volume is mounted (staged), read/write (its phase says so) or
        read-only (which holds no phase: only the daemon's run file tells)."""
        where = self.plugin.mountpoint(info.name)
        if where is None and info.phase == VolumePhase.MOUNTED:
            return f"a mount of process {info.owner_pid}"
        return where

    def _snapshots_of(self, volume: str) -> list[volumes.SnapshotInfo]:
        try:
            return volumes.list_snapshots(self.repo, volume)
        except NotFound:
            return []

    def _snapshot_info(self, ref: tuple[str, SnapshotNo]) -> volumes.SnapshotInfo | None:
        return next((s for s in self._snapshots_of(ref[0]) if s.n == ref[1]), None)

    def _labelled(self, label: str, volume: str | None = None) -> tuple[str, SnapshotNo] | None:
        """The snapshot with this label (of `volume`, or of any volume)."""
        found = volume_rows.labelled(self.repo.conn, label)
        return next((ref for ref in found if volume is None or ref[0] == volume), None)

    def _snapshot_message(
        self, volume: str, n: SnapshotNo, snap: volumes.SnapshotInfo | None = None
    ) -> pb.Snapshot:
        snap = snap or self._snapshot_info((volume, n))
        if snap is None:
            raise NotFound(f"no snapshot {volume}@{n}")
        created = timestamp_pb2.Timestamp()
        created.FromNanoseconds(int(snap.created * 1e9))
        stored = figures.snapshot_stored_bytes(self.repo, snap) if snap.folded else 0
        return pb.Snapshot(
            size_bytes=stored,
            snapshot_id=naming.snapshot_id(volume, n),
            source_volume_id=volume,
            creation_time=created,
            ready_to_use=True,  # (a clone of one still folding waits for its fold)
        )


def _check_kind(params: dict[str, str], kind: VolumeKind) -> None:
    if params.get("kind") and params["kind"] != kind.value:
        raise UsageError(
            f"parameter kind {params['kind']!r} does not match the source, a {kind.value} volume"
        )


def _required(value: str, what: str) -> str:
    if not value:
        raise UsageError(f"{what} is required")
    return value


def _request_record(request: pb.CreateVolumeRequest) -> dict[str, Any]:
    """What a CreateVolume asks, in the form kept and compared (records.py)."""
    params = {k: v for k, v in request.parameters.items() if not k.startswith(METADATA_PREFIX)}
    unknown = sorted(set(params) - set(PARAMETERS))
    if unknown:
        raise UsageError(f"unknown parameter {unknown[0]!r} (known: {', '.join(PARAMETERS)})")
    if params.get("kind", "dir") not in ("dir", "block"):
        raise UsageError(f"parameter kind is dir or block, not {params['kind']!r}")
    if "chunkSize" in params:
        from casfs.kinds import chunk_size_refusal

        why = chunk_size_refusal(parse_size(params["chunkSize"]))
        if why is not None:
            raise UsageError(why)
    source: dict[str, str] = {}
    which = request.volume_content_source.WhichOneof("type")
    if which == "snapshot":
        source["snapshot"] = _required(request.volume_content_source.snapshot.snapshot_id, "a snapshot id")
    elif which == "volume":
        source["volume"] = _required(request.volume_content_source.volume.volume_id, "a volume id")
    if source and "image" in params:
        raise UsageError("a volume comes from an image or from a content source, not both")
    required, limit = _capacity(request.capacity_range)
    return {"name": request.name, "params": params, "source": source, "required": required, "limit": limit}


def _capacity(r: pb.CapacityRange) -> tuple[int, int]:
    if r.required_bytes < 0 or r.limit_bytes < 0:
        raise UsageError("a capacity range's bytes cannot be negative")
    if r.limit_bytes and r.required_bytes > r.limit_bytes:
        raise OutOfRange(f"required_bytes {r.required_bytes} is over limit_bytes {r.limit_bytes}")
    return r.required_bytes, r.limit_bytes


def _block_size(required: int, chunk_size: int) -> int:
    """A block volume's size for `required` bytes: rounded up to whole chunks."""
    size = required or DEFAULT_BLOCK_BYTES
    return -(-size // chunk_size) * chunk_size


def _check_block_capacity(size: int, limit: int) -> None:
    why = block_size_refusal(size)
    if why is not None:
        raise OutOfRange(why)
    if limit and size > limit:
        raise OutOfRange(f"a block volume of at least {size} bytes is over limit_bytes {limit}")


def _token(token: str, kind: str) -> str:
    """Where a listing resumes: after the key the token names (so that entries added
    between pages neither repeat nor shift the next page)."""
    if not token:
        return ""
    prefix = kind + ":"
    if not token.startswith(prefix) or len(token) == len(prefix):
        raise BadToken(f"invalid starting token {token!r}")
    return token[len(prefix) :]


def _snapshot_key(volume: str, n: SnapshotNo) -> str:
    return f"{volume}@{n:012d}"  # (sorts by volume, then number)


def _page(items: list[Any], max_entries: int) -> tuple[list[Any], bool]:
    if max_entries < 0:
        raise UsageError("max_entries cannot be negative")
    if not max_entries or len(items) <= max_entries:
        return items, False
    return items[:max_entries], True
