"""The Node service: a volume staged is a casfs mount, published is a bind of it.

    NodeStageVolume      `casfs mount STAGING --volume ID` as the launcher starts it: the
                         daemon runs in its own session, so a restart of the plugin never
                         takes a mount down. A block volume is mounted on STAGING/disk, a
                         regular file (FUSE mounts on files).
    NodePublishVolume    a directory volume: a bind of the staging mount at the target
                         (read-only, mount flags: a remount of the bind). A block volume: a
                         loop device over STAGING/disk (direct I/O), its device node bound
                         at the target file, as kubelet hands pods their volumeDevices.
    NodeUnpublishVolume  the bind unmounted (and its loop device detached), the target removed.
    NodeUnstageVolume    `casfs umount`: a changed volume gets its snapshot; a failure to
                         save keeps the mount and says why.

Every answer is read from the kernel's mount table, the loop devices' backing files and
the daemons' run files, never from memory: a plugin restarted after kill -9 answers each
repeat as the first one did.
"""

from __future__ import annotations

import contextlib
import logging
import os

from casfs import volumes
from casfs.csi import capabilities, naming, records, system
from casfs.csi.codes import InUse, Unmet
from casfs.csi.health import condition
from casfs.csi.plugin import Plugin
from casfs.csi.proto import csi_pb2 as pb
from casfs.errors import Conflict, NotFound, UsageError
from casfs.fuse.launcher import Config, served_volume, start_daemon, unmount
from casfs.fuse.mountinfo import MountEntry
from casfs.kinds import VolumeKind
from casfs.replica import active
from casfs.replica.agent import local

log = logging.getLogger("casfs.csi")
BLOCK_FILE = "disk"  # a block volume's mount point inside its staging directory
Rpc = pb.NodeServiceCapability.RPC
CAPABILITIES = (
    Rpc.STAGE_UNSTAGE_VOLUME,
    Rpc.GET_VOLUME_STATS,
    Rpc.EXPAND_VOLUME,
    Rpc.VOLUME_CONDITION,
    Rpc.SINGLE_NODE_MULTI_WRITER,
)
Usage = pb.VolumeUsage


class Node:
    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin

    def NodeStageVolume(self, request: pb.NodeStageVolumeRequest) -> pb.NodeStageVolumeResponse:
        vid = _required(request.volume_id, "a volume id")
        staging = _path(request.staging_target_path, "a staging target path")
        cap = _capability(request)
        info = self._volume(vid)
        capabilities.check([cap], info.kind)
        where = _staged_path(staging, info.kind)
        if self._staged_at(where, info.name):
            return pb.NodeStageVolumeResponse()  # (a repeat)
        elsewhere = self.plugin.mountpoint(info.name)
        if elsewhere is not None:
            raise InUse(f"volume {info.name!r} is staged at {elsewhere} already")
        os.makedirs(staging, exist_ok=True)
        if info.kind == VolumeKind.BLOCK:
            with open(where, "a"):
                pass  # (FUSE mounts a file's volume on a file)
        read_only = capabilities.read_only_mode(cap) or info.mode == "ro"
        reg = None if read_only else self.plugin.registry
        if reg is not None:  # (a replicated volume: `active` here first, caught up)
            active.take(reg, info.name, self.plugin.node_id, lambda: active.opened(self.plugin.repo))
        # (suid: the publish's bind decides, with the pod's mount flags, as on a disk)
        cfg = Config(
            self.plugin.store, where, volume=info.name, read_only=read_only, allow_other=True, suid=True
        )
        try:
            for warning in start_daemon(cfg):
                log.warning("volume %s: %s", info.name, warning)
        except BaseException:
            if reg is not None:
                active.release(reg, info.name, self.plugin.node_id)
            raise
        return pb.NodeStageVolumeResponse()

    def NodeUnstageVolume(self, request: pb.NodeUnstageVolumeRequest) -> pb.NodeUnstageVolumeResponse:
        vid = _required(request.volume_id, "a volume id")
        staging = _path(request.staging_target_path, "a staging target path")
        for where in (staging, os.path.join(staging, BLOCK_FILE)):
            entry = system.mount_at(where)
            if entry is None or not entry.is_casfs:
                continue
            self._check_unpublished(entry, where)
            if self._staged_at(where, naming.known_volume(vid) or vid):  # (a dead one: detached)
                unmount(where, took=lambda snap: log.info("volume %s: snapshot %s at unmount", vid, snap))
                self._release(naming.known_volume(vid) or vid)
        block_file = os.path.join(staging, BLOCK_FILE)
        if os.path.isfile(block_file) and system.mount_at(block_file) is None:
            os.unlink(block_file)
        if naming.known_volume(vid) is None or not self._exists(vid):
            raise NotFound(f"no volume {vid!r}")
        return pb.NodeUnstageVolumeResponse()

    def _release(self, volume: str) -> None:
        """A replicated volume's unmount snapshot published and `active` released."""
        if self.plugin.registry is not None:
            here = local(self.plugin.repo, volume)
            active.release(
                self.plugin.registry, volume, self.plugin.node_id, None if here is None else here[:2]
            )

    def _check_unpublished(self, entry: MountEntry, where: str) -> None:
        """Unmounting a staging mount still bound elsewhere would leave its daemon
        serving those binds: refused, naming them."""
        binds = [m.mountpoint for m in system.mounts_of_device(entry.device) if m.mountpoint != where]
        loops = system.loops_of(where)
        if binds or loops:
            raise InUse(f"{where} is still published at {', '.join(binds + loops)}: unpublish it first")

    def NodePublishVolume(self, request: pb.NodePublishVolumeRequest) -> pb.NodePublishVolumeResponse:
        vid = _required(request.volume_id, "a volume id")
        staging = _path(request.staging_target_path, "a staging target path")
        target = _path(request.target_path, "a target path")
        cap = _capability(request)
        info = self._volume(vid)
        capabilities.check([cap], info.kind)
        staged = _staged_path(staging, info.kind)
        stage = system.mount_at(staged)
        if stage is None or not self._staged_at(staged, info.name):
            raise Unmet(f"volume {info.name!r} is not staged at {staging}")
        read_only = request.readonly or capabilities.read_only_mode(cap)
        flags = list(cap.mount.mount_flags) if cap.WhichOneof("access_type") == "mount" else []
        if info.kind == VolumeKind.BLOCK:
            self._publish_block(staged, target, read_only)
        else:
            self._publish_dir(stage, target, read_only, flags)
        return pb.NodePublishVolumeResponse()

    def _publish_dir(self, stage: MountEntry, target: str, read_only: bool, flags: list[str]) -> None:
        existing = system.mount_at(target)
        if existing is not None:
            if existing.device != stage.device:
                raise Conflict(f"{target} has another filesystem mounted")
            if existing.read_only != (read_only or "ro" in flags):
                raise Conflict(
                    f"volume is published at {target} {'read/write' if read_only else 'read-only'}"
                )
            return  # (a repeat)
        os.makedirs(target, exist_ok=True)
        system.bind(stage.mountpoint, target, read_only, flags)

    def _publish_block(self, staged: str, target: str, read_only: bool) -> None:
        existing = system.mount_at(target)
        if existing is not None:
            device = system.loop_of_bind(existing)
            if device is None or system.loop_backing(device) != staged:
                raise Conflict(f"{target} has another device mounted")
            if _loop_read_only(device) != read_only:
                raise Conflict(
                    f"volume is published at {target} {'read/write' if read_only else 'read-only'}"
                )
            return
        os.makedirs(os.path.dirname(target) or "/", exist_ok=True)
        with open(target, "a"):
            pass  # (the device node is bound on a file)
        device = system.attach_loop(staged, read_only)
        try:
            system.bind(device, target, False, [])
        except BaseException:
            system.detach_loop(device)
            raise

    def NodeUnpublishVolume(self, request: pb.NodeUnpublishVolumeRequest) -> pb.NodeUnpublishVolumeResponse:
        vid = _required(request.volume_id, "a volume id")
        target = _path(request.target_path, "a target path")
        entry = system.mount_at(target)
        if entry is None and not self._exists(vid):
            raise NotFound(f"no volume {vid!r}")
        while entry is not None:  # (binds stacked by a CO that lost count: all of them)
            device = system.loop_of_bind(entry)
            system.unmount(target)
            if device is not None:
                system.detach_loop(device)
            entry = system.mount_at(target)
        _remove(target)
        return pb.NodeUnpublishVolumeResponse()

    def _published(self, volume_id: str, volume_path: str) -> tuple[str, volumes.VolumeInfo]:
        """The path and volume of a stats or expansion request: NotFound unless the
        volume is published there."""
        vid = _required(volume_id, "a volume id")
        path = _path(volume_path, "a volume path")
        info = self._volume(vid)
        if system.mount_at(path) is None:
            raise NotFound(f"volume {vid!r} is not published at {path}")
        return path, info

    def NodeGetVolumeStats(self, request: pb.NodeGetVolumeStatsRequest) -> pb.NodeGetVolumeStatsResponse:
        path, info = self._published(request.volume_id, request.volume_path)
        if info.kind == VolumeKind.BLOCK:
            usage = [Usage(total=info.size, unit=Usage.BYTES)]
        else:
            st = os.statvfs(path)
            total, free, avail = (
                st.f_blocks * st.f_frsize,
                st.f_bfree * st.f_frsize,
                st.f_bavail * st.f_frsize,
            )
            usage = [
                Usage(total=total, available=avail, used=total - free, unit=Usage.BYTES),
                Usage(
                    total=st.f_files, available=st.f_favail, used=st.f_files - st.f_ffree, unit=Usage.INODES
                ),
            ]
        return pb.NodeGetVolumeStatsResponse(usage=usage, volume_condition=condition(self.plugin, info))

    def NodeExpandVolume(self, request: pb.NodeExpandVolumeRequest) -> pb.NodeExpandVolumeResponse:
        """A block volume's loop devices take its size again; a directory volume has none to take."""
        _, info = self._published(request.volume_id, request.volume_path)
        if info.kind == VolumeKind.DIR:
            record = records.read(self.plugin.store, info.name) or {}
            return pb.NodeExpandVolumeResponse(capacity_bytes=int(record.get("capacity", 0)))
        staged = self.plugin.mountpoint(info.name)
        for device in system.loops_of(staged) if staged else []:
            system.refresh_loop(device)
        return pb.NodeExpandVolumeResponse(capacity_bytes=info.size)

    def NodeGetCapabilities(self, request: pb.NodeGetCapabilitiesRequest) -> pb.NodeGetCapabilitiesResponse:
        caps = [pb.NodeServiceCapability(rpc=Rpc(type=t)) for t in CAPABILITIES]
        return pb.NodeGetCapabilitiesResponse(capabilities=caps)

    def NodeGetInfo(self, request: pb.NodeGetInfoRequest) -> pb.NodeGetInfoResponse:
        return pb.NodeGetInfoResponse(
            node_id=self.plugin.node_id,
            max_volumes_per_node=self.plugin.max_volumes_per_node,
            accessible_topology=self.plugin.topology(),
        )

    # -- helpers ----------------------------------------------------------------------

    def _volume(self, vid: str) -> volumes.VolumeInfo:
        name = naming.known_volume(vid)
        if name is None:
            raise NotFound(f"no volume {vid!r}")
        return volumes.get_volume(self.plugin.repo, name)

    def _exists(self, vid: str) -> bool:
        """Whether `vid` names a volume (False for a malformed id too)."""
        try:
            self._volume(vid)
        except NotFound:
            return False
        return True

    def _staged_at(self, where: str, volume: str) -> bool:
        """Whether `where` is a casfs mount of `volume` that a daemon serves; Conflict if
        of another volume. The mount of a daemon that died (killed, or its container
        restarted) only answers ENOTCONN: it is detached, and the volume is not staged."""
        entry = system.mount_at(where)
        if entry is None or not entry.is_casfs:
            return False
        served, serving = served_volume(self.plugin.store, where)
        if served != volume:
            raise Conflict(
                f"{where} is a casfs mount of {served or 'another store'}, not of volume {volume!r}"
            )
        if not serving:
            log.warning("volume %s: its daemon at %s is gone: detaching the dead mount", volume, where)
            system.run(["fusermount3", "-u", "-z", where], f"detaching the dead mount {where}")
        return serving


def _required(value: str, what: str) -> str:
    if not value:
        raise UsageError(f"{what} is required")
    return value


def _path(value: str, what: str) -> str:
    if not _required(value, what).startswith("/"):
        raise UsageError(f"{what} is an absolute path, not {value!r}")
    return os.path.normpath(value)


def _capability(request: pb.NodeStageVolumeRequest | pb.NodePublishVolumeRequest) -> pb.VolumeCapability:
    if not request.HasField("volume_capability"):
        raise UsageError("a volume capability is required")
    return request.volume_capability


def _staged_path(staging: str, kind: VolumeKind) -> str:
    return os.path.join(staging, BLOCK_FILE) if kind == VolumeKind.BLOCK else staging


def _loop_read_only(device: str) -> bool:
    with contextlib.suppress(OSError), open(f"/sys/block/{os.path.basename(device)}/ro") as f:
        return f.read().strip() == "1"
    return False


def _remove(target: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(target) and not os.path.islink(target):
            os.rmdir(target)
        else:
            os.unlink(target)
