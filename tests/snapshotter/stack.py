"""containerd and `casfs snapshotter serve` in tests: both real, in a short temp dir of
their own under /tmp (unix sockets' paths are short; and mounts there outlive a test
without counting as its leftovers: the stack's own teardown removes them).

    with running(image_tar) as s:            # a store, the snapshotter, containerd
        s.ctr("run", "--rm", "--snapshotter", "casfs", REF, "c1")
        s.kill9_snapshotter(); s.start_snapshotter()
    # here: both stopped by pid; every casfs mount, daemon and runc container gone

containerd runs with its own config: root, state and sockets in the temp dir, the
casfs proxy plugin, the plugins that need what this machine lacks (CRI, btrfs, zfs,
devmapper, aufs) disabled, and its garbage collection run after every deletion (it
is what removes a deleted container's snapshot; by default it may wait for more).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from casfs.repo import Repository
from casfs.snapshotter.proto import snapshots_pb2_grpc
from tests.helpers import mount
from tests.helpers.csi import cleanup_under, terminate

START_TIMEOUT_S = 60.0
WAIT_S = 60.0
DISABLED = (
    "io.containerd.grpc.v1.cri",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.aufs",
)
REF = "example.com/bb:v1"


def config(base: Path) -> str:
    """containerd's config (version 2, containerd 1.6+)."""
    disabled = ", ".join(f'"{p}"' for p in DISABLED)
    return f"""version = 2
root = "{base}/ctrd-root"
state = "{base}/ctrd-state"
disabled_plugins = [{disabled}]
[grpc]
  address = "{base}/containerd.sock"
[ttrpc]
  address = "{base}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/opt"
[plugins."io.containerd.gc.v1.scheduler"]
  deletion_threshold = 1
  schedule_delay = "0ms"
  pause_threshold = 0.5
[proxy_plugins.casfs]
  type = "snapshot"
  address = "{base}/casfs.sock"
"""


@dataclass
class Stack:
    base: Path
    snap: subprocess.Popen[bytes] | None = None
    ctrd: subprocess.Popen[bytes] | None = None

    @property
    def store(self) -> Path:
        return self.base / "store"

    @property
    def store_mount(self) -> Path:
        """The one whole-store mount serving every active and view snapshot."""
        return self.base / "sroot" / "mounts" / "store"

    def store_daemon(self) -> int | None:
        """The pid of the store mount's live daemon."""
        from casfs.fuse.launcher import running_mounts

        found = [r for r in running_mounts(self.store) if r.get("mountpoint") == str(self.store_mount)]
        return found[0].get("pid") if found else None

    @property
    def socket(self) -> Path:
        return self.base / "casfs.sock"

    @property
    def containerd_socket(self) -> Path:
        return self.base / "containerd.sock"

    # -- processes -------------------------------------------------------------------

    def start_snapshotter(self, fault: str | None = None, stop: str | None = None) -> None:
        """`fault`: a fault point (casfs.lifecycle.faults) where it kills itself; `stop`:
        one where it stops itself (SIGSTOP), each time it passes there."""
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()  # (so that the wait below sees the new one)
        cmd = [sys.executable, "-m", "casfs", "-s", str(self.store), "snapshotter", "serve"]
        cmd += ["--address", f"unix://{self.socket}", "--root", str(self.base / "sroot")]
        env = {k: v for k, v in os.environ.items() if k not in ("CASFS_FAULT", "CASFS_STOP")}
        for name, point in (("CASFS_FAULT", fault), ("CASFS_STOP", stop)):
            if point is not None:
                env[name] = point
        with open(self.base / "snapshotter.log", "ab") as log:
            self.snap = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        self._wait_socket(self.socket, self.snap, "snapshotter.log")

    def start_containerd(self) -> None:
        (self.base / "config.toml").write_text(config(self.base))
        cmd = ["containerd", "--config", str(self.base / "config.toml")]
        with open(self.base / "containerd.log", "ab") as log:
            # (its own session: the runc shims it starts are ended by it or by stop_all)
            self.ctrd = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        self._wait_socket(self.containerd_socket, self.ctrd, "containerd.log")
        deadline = time.monotonic() + START_TIMEOUT_S
        while subprocess.run(self._ctr("version"), capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, f"containerd did not answer:\n{self.log('containerd.log')}"
            time.sleep(0.05)

    def wait_reconnected(self) -> None:
        """containerd reaches the snapshotter again (after a restart of the snapshotter,
        its gRPC client retries the connection with a back-off)."""

        def answers() -> bool:
            done = subprocess.run(self._ctr("snapshots", "--snapshotter", "casfs", "ls"), capture_output=True)
            return done.returncode == 0

        self.wait("containerd reconnected to the snapshotter", answers, timeout=180)

    def _wait_socket(self, path: Path, proc: subprocess.Popen[bytes], log: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not path.exists():
            assert proc.poll() is None, f"exited {proc.returncode}:\n{self.log(log)}"
            assert time.monotonic() < deadline, f"no socket within {START_TIMEOUT_S} s:\n{self.log(log)}"
            time.sleep(0.02)

    def log(self, name: str = "snapshotter.log") -> str:
        try:
            return (self.base / name).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill9_snapshotter(self) -> None:
        if self.snap is not None:
            self.snap.kill()
            self.snap.wait(timeout=30)
            self.snap = None

    def kill9_containerd(self) -> None:
        if self.ctrd is not None:
            self.ctrd.kill()
            self.ctrd.wait(timeout=30)
            self.ctrd = None

    def stop_snapshotter(self) -> int | None:
        proc, self.snap = self.snap, None
        return terminate(proc)

    def stop_containerd(self) -> int | None:
        proc, self.ctrd = self.ctrd, None
        return terminate(proc)

    # -- driving ---------------------------------------------------------------------

    def _ctr(self, *args: str, namespace: str = "default") -> list[str]:
        return ["ctr", "--address", str(self.containerd_socket), "--namespace", namespace, *args]

    def ctr(self, *args: str, namespace: str = "default", check: bool = True, timeout: float = 300) -> str:
        done = subprocess.run(
            self._ctr(*args, namespace=namespace), capture_output=True, text=True, timeout=timeout
        )
        if check:
            assert done.returncode == 0, (
                f"ctr {' '.join(args)}: {done.returncode}\n{done.stdout}{done.stderr}"
            )
        return done.stdout + (done.stderr if not check and done.returncode else "")

    def ctr_popen(self, *args: str, namespace: str = "default") -> subprocess.Popen[str]:
        return subprocess.Popen(
            self._ctr(*args, namespace=namespace), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def task_status(self, container: str, namespace: str = "default") -> str | None:
        for line in self.ctr("tasks", "ls", namespace=namespace).splitlines()[1:]:
            words = line.split()
            if words and words[0] == container:
                return words[-1]
        return None

    def end(self, container: str, namespace: str = "default") -> None:
        """Its task killed and deleted, then the container (containerd's gc then removes
        its snapshot)."""
        self.ctr("tasks", "kill", "-s", "SIGKILL", container, namespace=namespace, check=False)
        self.wait(f"{container} stopped", lambda: self.task_status(container, namespace) in (None, "STOPPED"))
        self.ctr("tasks", "delete", container, namespace=namespace, check=False)
        self.ctr("containers", "delete", container, namespace=namespace, check=False)

    def gc(self, namespace: str = "default") -> None:
        """containerd's garbage collection, now: a lease deleted with --sync runs it
        (it removes the snapshots of deleted containers)."""
        lease = self.ctr("leases", "create", namespace=namespace).split()[0]
        self.ctr("leases", "delete", "--sync", lease, namespace=namespace)

    def casfs(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "casfs", "-s", str(self.store), *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"casfs {' '.join(args)}: {done.returncode}\n{done.stdout}{done.stderr}"
        return done.stdout

    def snapshots(self, namespace: str = "default") -> dict[str, str]:
        """containerd's snapshots of the casfs snapshotter: name -> kind."""
        out = self.ctr("snapshots", "--snapshotter", "casfs", "ls", namespace=namespace)
        return {w[0]: w[-1] for w in (line.split() for line in out.splitlines()[1:]) if w}

    def records(self) -> dict[str, dict[str, Any]]:
        """The snapshotter's own records (the catalog, read through casfs): key -> record."""
        from casfs.snapshotter import records

        with contextlib.closing(Repository.open(self.store)) as repo:
            return {
                r.key: {"kind": r.kind, "volume": r.volume, "phase": r.phase} for r in records.every(repo)
            }

    def volumes(self) -> dict[str, dict[str, Any]]:
        return {v["name"]: v for v in json.loads(self.casfs("volume", "ls", "--json"))}

    def wait(self, what: str, ok: Callable[[], bool], timeout: float = WAIT_S) -> None:
        """Until `ok()` (containerd removes snapshots in its own garbage collection,
        after the RPC that released them has answered)."""
        deadline = time.monotonic() + timeout
        while not ok():
            assert time.monotonic() < deadline, (
                f"{what}: not within {timeout} s\nsnapshotter:\n{self.log()[-3000:]}\n"
                f"containerd:\n{self.log('containerd.log')[-3000:]}"
            )
            time.sleep(0.1)

    def stub(self) -> snapshots_pb2_grpc.SnapshotsStub:
        return snapshots_pb2_grpc.SnapshotsStub(grpc.insecure_channel(f"unix://{self.socket}"))

    # -- teardown --------------------------------------------------------------------

    def stop_all(self) -> None:
        """Tasks killed and containers deleted (their runc shims end), containerd and the
        snapshotter stopped, every mount and daemon of the store removed."""
        if self.ctrd is not None:
            with contextlib.suppress(Exception):
                for ns in self.ctr("namespaces", "ls", "-q").split():
                    for c in self.ctr("containers", "ls", "-q", namespace=ns).split():
                        self.end(c, namespace=ns)
        self.stop_containerd()
        self.stop_snapshotter()
        for pid in _shims(self.base):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        cleanup_under(self.base)
        for pid in mount.daemon_pids(str(self.base)):
            mount.cleanup("", pid)


def _shims(base: Path) -> list[int]:
    """containerd-shim processes started by this stack's containerd (their command
    lines name its socket)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and b"containerd-shim" in cmdline[0] and any(str(base).encode() in a for a in cmdline):
            found.append(int(entry))
    return found


@contextlib.contextmanager
def running(containerd: bool = True, parent: str = "/tmp") -> Iterator[Stack]:
    base = Path(tempfile.mkdtemp(prefix="ctrsn-", dir=parent))
    s = Stack(base)
    try:
        Repository.init(s.store).close()
        s.start_snapshotter()
        if containerd:
            s.start_containerd()
        yield s
    finally:
        try:
            s.stop_all()
        finally:
            if not [m for m in mount.casfs_mounts(str(base))]:
                shutil.rmtree(base, ignore_errors=True)
