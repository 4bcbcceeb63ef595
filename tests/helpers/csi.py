"""`casfs csi serve` in tests: a subprocess on a unix socket, driven by the generated stubs.

    with plugin_running(store, kubelet_dir) as p:   # started, Probe answered
        p.controller.CreateVolume(...)                # stubs: p.identity, p.controller, p.node
        p.kill9(); p.start()                          # a restart, the same socket
    # here: the plugin stopped by pid; every bind, loop device and casfs mount under
    # kubelet_dir removed, even when the test failed

The socket is in a short directory of its own under /tmp (a unix socket's path is at
most 107 bytes; pytest's tmp_path can be longer).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from casfs.csi.proto import csi_pb2 as pb
from casfs.csi.proto import csi_pb2_grpc as rpc
from casfs.fuse.mountinfo import mounts
from tests.helpers import mount

NODE_ID = "node-1"
START_TIMEOUT_S = 30.0
RPC_TIMEOUT_S = 120.0
Mode = pb.VolumeCapability.AccessMode


def mount_cap(mode: int = Mode.SINGLE_NODE_WRITER, flags: tuple[str, ...] = ()) -> pb.VolumeCapability:
    return pb.VolumeCapability(
        mount=pb.VolumeCapability.MountVolume(mount_flags=list(flags)),
        access_mode=Mode(mode=mode),  # type: ignore[arg-type]
    )


def block_cap(mode: int = Mode.SINGLE_NODE_WRITER) -> pb.VolumeCapability:
    return pb.VolumeCapability(
        block=pb.VolumeCapability.BlockVolume(),
        access_mode=Mode(mode=mode),  # type: ignore[arg-type]
    )


class _Deadline(grpc.UnaryUnaryClientInterceptor):
    """Every call from a test has a deadline (a hung plugin fails the test, not the run)."""

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if details.timeout is None:
            details = details._replace(timeout=RPC_TIMEOUT_S)
        return continuation(details, request)


@dataclass
class Plugin:
    store: Path
    socket: Path
    log_path: Path
    node_id: str = NODE_ID
    proc: subprocess.Popen[bytes] | None = None
    channel: grpc.Channel | None = None
    identity: rpc.IdentityStub = field(init=False)
    controller: rpc.ControllerStub = field(init=False)
    node: rpc.NodeStub = field(init=False)

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def start(self, *extra: str) -> None:
        cmd = [sys.executable, "-m", "casfs", "-s", str(self.store), "csi", "serve"]
        cmd += ["--endpoint", self.endpoint, "--node-id", self.node_id, *extra]
        env = {**os.environ, "CASFS_TEST_TIMEOUTS": "0"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        self._connect()

    def _connect(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.socket.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"the plugin exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the plugin did not listen within {START_TIMEOUT_S} s:\n{self.log()}")
            time.sleep(0.02)
        self.channel = grpc.insecure_channel(self.endpoint)
        grpc.channel_ready_future(self.channel).result(timeout=START_TIMEOUT_S)
        channel = grpc.intercept_channel(self.channel, _Deadline())
        self.identity = rpc.IdentityStub(channel)
        self.controller = rpc.ControllerStub(channel)
        self.node = rpc.NodeStub(channel)
        assert self.identity.Probe(pb.ProbeRequest(), timeout=RPC_TIMEOUT_S).ready.value

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill9(self) -> None:
        """kill -9 of the plugin (its mount daemons, in sessions of their own, live on)."""
        self._close_channel()
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 30 s; the exit status (None if not running)."""
        self._close_channel()
        proc, self.proc = self.proc, None
        return terminate(proc)

    def _close_channel(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None


def terminate(proc: subprocess.Popen[bytes] | None) -> int | None:
    """SIGTERM, then SIGKILL after 30 s; the exit status (None if not running)."""
    if proc is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=30)


def cleanup_under(base: Path) -> None:
    """Whatever a test left under `base`: binds (their loop devices detached), then
    loop devices over files there, then casfs mounts and their daemons."""
    prefix = str(base) + "/"
    for m in reversed([m for m in mounts() if m.mountpoint.startswith(prefix) and not m.is_casfs]):
        with contextlib.suppress(subprocess.TimeoutExpired):
            if subprocess.run(["umount", m.mountpoint], capture_output=True, timeout=30).returncode:
                subprocess.run(["umount", "-l", m.mountpoint], capture_output=True, timeout=30)
        name = m.root.lstrip("/")
        if name.startswith("loop") and name[4:].isdigit():
            subprocess.run(["losetup", "-d", f"/dev/{name}"], capture_output=True, timeout=30)
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().strip().startswith(prefix):
                subprocess.run(["losetup", "-d", f"/dev/{backing.parts[3]}"], capture_output=True, timeout=30)
    for m in [m for m in mounts() if m.mountpoint.startswith(prefix) and m.is_casfs]:
        mount.cleanup(m.mountpoint, None)
    for pid in mount.daemon_pids(str(base)):
        mount.cleanup("", pid)


def leftovers_under(base: Path) -> list[str]:
    prefix = str(base) + "/"
    found = [m.mountpoint for m in mounts() if m.mountpoint.startswith(prefix)]
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().strip().startswith(prefix):
                found.append(f"/dev/{backing.parts[3]}")
    return found


@contextlib.contextmanager
def plugin_running(store: Path, kubelet: Path, *extra: str) -> Iterator[Plugin]:
    kubelet.mkdir(parents=True, exist_ok=True)
    sockdir = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))
    p = Plugin(store, sockdir / "csi.sock", kubelet / "plugin.log")
    try:
        p.start(*extra)
        yield p
    finally:
        try:
            p.stop()
        finally:
            cleanup_under(kubelet)
            shutil.rmtree(sockdir, ignore_errors=True)


# -- what kubelet and the provisioner send ------------------------------------------------


def create(p: Plugin, name: str, cap: pb.VolumeCapability, size: int = 0, **kw: Any) -> pb.Volume:
    req = pb.CreateVolumeRequest(
        name=name, volume_capabilities=[cap], capacity_range=pb.CapacityRange(required_bytes=size), **kw
    )
    return p.controller.CreateVolume(req).volume


def from_snapshot(snapshot_id: str) -> pb.VolumeContentSource:
    return pb.VolumeContentSource(snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id=snapshot_id))


def from_volume(volume_id: str) -> pb.VolumeContentSource:
    return pb.VolumeContentSource(volume=pb.VolumeContentSource.VolumeSource(volume_id=volume_id))


def stage(p: Plugin, vid: str, staging: Path, cap: pb.VolumeCapability) -> None:
    p.node.NodeStageVolume(
        pb.NodeStageVolumeRequest(volume_id=vid, staging_target_path=str(staging), volume_capability=cap)
    )


def publish(
    p: Plugin, vid: str, staging: Path, target: Path, cap: pb.VolumeCapability, readonly: bool = False
) -> None:
    req = pb.NodePublishVolumeRequest(
        volume_id=vid,
        staging_target_path=str(staging),
        target_path=str(target),
        volume_capability=cap,
        readonly=readonly,
    )
    p.node.NodePublishVolume(req)


def unpublish(p: Plugin, vid: str, target: Path) -> None:
    p.node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vid, target_path=str(target)))


def unstage(p: Plugin, vid: str, staging: Path) -> None:
    p.node.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=str(staging)))


def snapshot(p: Plugin, vid: str, name: str) -> pb.Snapshot:
    return p.controller.CreateSnapshot(pb.CreateSnapshotRequest(source_volume_id=vid, name=name)).snapshot


def snapshots_of(p: Plugin, vid: str) -> list[pb.Snapshot]:
    entries = p.controller.ListSnapshots(pb.ListSnapshotsRequest(source_volume_id=vid)).entries
    return [e.snapshot for e in entries]


def code_of(call: Any, request: Any) -> grpc.StatusCode:
    """The status code a call ends with (OK if it succeeds)."""
    try:
        call(request)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK
