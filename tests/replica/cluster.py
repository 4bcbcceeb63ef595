"""A real etcd and three nodes for the registry and agent tests.

`etcd`: a one-member etcd (Debian's etcd-server) on 127.0.0.1, free ports, a temporary
data dir, fast raft ticks so that etcd's minimum lease TTL is 1 s; stopped by pid, and
restartable on the same ports and data (`Etcd.stop()`, `.start()`) for the outage test.

`cluster`: three stores = three nodes n1, n2, n3, each with `casfs replica agent` in a
subprocess (killed by pid at the end, whatever happened), reaching each other over the
test sshd; every mount the test made is cleaned up, every store fsck'd (`stores`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from casfs.repo import Repository
from tests.helpers.cli import CLI, env
from tests.helpers.fsck import Stores, query
from tests.helpers.mount import cleanup, is_mounted
from tests.helpers.snapshots import wait_until
from tests.replica.conftest import Sshd

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
TTL = 2  # the agents' lease (s): a dead agent shows as not alive this long after


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Etcd:
    data: Path
    port: int = field(default_factory=free_port)
    peer: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def url(self, prefix: str) -> str:
        return f"etcd://127.0.0.1:{self.port}/{prefix}"

    def start(self) -> None:
        client, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer}"
        log = open(self.data.parent / "etcd.log", "ab")  # noqa: SIM115 (the child holds it)
        self.proc = subprocess.Popen(
            [ETCD, "--name", "t", "--data-dir", str(self.data), "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer, "--initial-cluster", f"t={peer}",
             "--heartbeat-interval", "10", "--election-timeout", "100"],
            stdout=log, stderr=log,
        )  # fmt: skip
        log.close()
        try:
            wait_until("etcd answers", self._healthy, 30)
        except BaseException:
            self.stop()  # (a start that failed leaves no etcd behind)
            raise

    def _healthy(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, "etcd exited"
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                pass
        except OSError:
            return False
        from casfs.errors import CasfsError
        from casfs.replica.registry import Registry

        try:
            Registry(self.url("health")).revision()
        except CasfsError:
            return False
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    if not os.path.exists(ETCD):
        pytest.skip("etcd is not installed (scripts/install.sh installs etcd-server)")
    server = Etcd(tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Node:
    name: str
    store: Path
    reach: str
    agent: subprocess.Popen[bytes] | None = None
    log: Path | None = None


@dataclass
class Cluster:
    registry: str
    sshd: Sshd
    nodes: dict[str, Node]
    tmp: Path
    mounts: list[Path] = field(default_factory=list)

    def env(self, node: str | None = None, **extra: str) -> dict[str, str]:
        more = {"CASFS_REGISTRY": self.registry, "CASFS_SSH": self.sshd.ssh, "CASFS_REMOTE": self.sshd.remote,
                "CASFS_REPLICA_TTL": str(TTL), "CASFS_REPLICA_POLL": "0.05", "CASFS_SSH_PERSIST": "0",
                "CASFS_TEST_TIMEOUTS": "0", **extra}  # fmt: skip
        if node is not None:
            more["CASFS_NODE"] = node
        return env(**more)

    def run(self, node: str | None, *args: str | Path, **extra: str) -> subprocess.CompletedProcess[str]:
        """`casfs [-s NODE's store] ARGS` as NODE, with the registry in the environment."""
        where = ["-s", str(self.nodes[node].store)] if node is not None else []
        return subprocess.run(
            [*CLI, *where, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=120,
            env=self.env(node, **extra),
        )

    def ok(self, node: str | None, *args: str | Path) -> str:
        p = self.run(node, *args)
        assert p.returncode == 0, (args, p.returncode, p.stdout, p.stderr)
        return p.stdout

    def start_agent(self, name: str, ttl: int = TTL, **extra: str) -> None:
        n = self.nodes[name]
        n.log = self.tmp / f"agent-{name}.log"
        with open(n.log, "ab") as log:
            n.agent = subprocess.Popen(
                [*CLI, "-s", str(n.store), "replica", "agent", "--reach", n.reach],
                stdout=log, stderr=log, env=self.env(name, CASFS_REPLICA_TTL=str(ttl), **extra),
            )  # fmt: skip

    def kill_agent(self, name: str, sig: int = signal.SIGKILL) -> None:
        n = self.nodes[name]
        if n.agent is not None and n.agent.poll() is None:
            os.kill(n.agent.pid, sig)
            n.agent.wait(timeout=30)
        n.agent = None

    def replicas(self, volume: str) -> dict[str, dict[str, Any]]:
        doc = json.loads(self.ok(None, "replica", "ls", volume, "--json"))
        return {r["node"]: r for r in doc["replicas"]}

    def record(self, volume: str) -> dict[str, Any]:
        return dict(json.loads(self.ok(None, "replica", "ls", volume, "--json")))

    def all_hold(self, volume: str, n: int, nodes: tuple[str, ...] = ("n1", "n2", "n3")) -> bool:
        """Every node's store holds VOL@n (asked of the stores, not the registry)."""
        return all(n in self.local_snapshots(node, volume) for node in nodes)

    def all_reach(self, volume: str, n: int) -> bool:
        """Every node's newest snapshot of VOL is n or newer (a follower pulls the newest)."""
        return all(max(self.local_snapshots(node, volume), default=0) >= n for node in self.nodes)

    def local_snapshots(self, node: str, volume: str) -> list[int]:
        """VOL's snapshots in NODE's store, read-only, while its agent writes there (a
        connection opening as the last other one closes its WAL may meet SQLITE_IOERR:
        asked again)."""
        for _ in range(50):
            try:
                rows = query(
                    self.nodes[node].store, "SELECT n FROM snapshots WHERE volume = ? ORDER BY n", volume
                )
            except sqlite3.OperationalError:
                time.sleep(0.05)
                continue
            return [int(n) for (n,) in rows]
        raise AssertionError(f"the catalog of {node} could not be read")

    def mount(self, node: str, volume: str, *more: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
        where = self.tmp / f"mnt-{node}-{volume}"
        where.mkdir(exist_ok=True)
        p = self.run(node, "mount", where, "--volume", volume, *more)
        if p.returncode == 0:
            self.mounts.append(where)
        return where, p

    def umount(self, node: str, where: Path) -> subprocess.CompletedProcess[str]:
        return self.run(node, "umount", where)


@pytest.fixture
def cluster(
    etcd: Etcd, sshd: Sshd, tmp_path: Path, stores: Stores, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    prefix = f"t{abs(hash(request.node.nodeid)) % 10**8}"
    nodes = {}
    for name in ("n1", "n2", "n3"):
        store = stores.add(tmp_path / name)
        Repository.init(store).close()
        nodes[name] = Node(name, store, sshd.url(store))
    c = Cluster(etcd.url(prefix), sshd, nodes, tmp_path)
    try:
        yield c
    finally:
        for name in nodes:
            c.kill_agent(name, signal.SIGTERM)
        for where in c.mounts:
            if is_mounted(where):
                cleanup(where, None)
        if etcd.proc is None:
            etcd.start()  # (a test that stopped it and failed)
