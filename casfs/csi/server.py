"""`casfs csi serve`: the gRPC server on a unix socket, over the three servicers.

Every RPC goes through casfs.grpcsvc's adapter: the per-volume in-progress lock (in
this process; across processes and restarts, the volume's phase in the catalog:
creating, deleting, mounted), errors through one table, one log line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

import grpc

from casfs import metrics
from casfs.csi import naming
from casfs.csi.controller import Controller
from casfs.csi.identity import Identity
from casfs.csi.node import Node
from casfs.csi.plugin import Plugin
from casfs.csi.proto import csi_pb2_grpc
from casfs.errors import CasfsError, UsageError
from casfs.grpcsvc.server import Adapter, InProgress, new_server, run_until_signalled
from casfs.metrics import RpcCounts
from casfs.replica.agent import Agent
from casfs.replica.registry import configured
from casfs.repo import Repository

log = logging.getLogger("casfs.csi")
SERVICES = ("controller", "node")

# RPCs that change a volume: taken under its lock (reads are answered meanwhile).
MUTATING = frozenset(
    {
        "CreateVolume",
        "DeleteVolume",
        "ControllerExpandVolume",
        "CreateSnapshot",
        "DeleteSnapshot",
        "NodeStageVolume",
        "NodeUnstageVolume",
        "NodePublishVolume",
        "NodeUnpublishVolume",
        "NodeExpandVolume",
    }
)


def volume_of(method: str, request: Any) -> str:
    """The volume id an RPC is about ('' if none, or if its arguments name none)."""
    with contextlib.suppress(CasfsError):
        if method == "CreateVolume":
            return naming.volume_id(request.name)
        if method == "CreateSnapshot":
            return str(request.source_volume_id)
        if method == "DeleteSnapshot":
            ref = naming.known_snapshot(request.snapshot_id)
            return ref[0] if ref else ""
    return str(getattr(request, "volume_id", ""))


def build(
    plugin: Plugin, services: tuple[str, ...], endpoint: str, counts: RpcCounts | None = None
) -> grpc.Server:
    """The server, its servicers added and its socket bound (not started); `counts`:
    each RPC counted there (--metrics)."""
    server, _ = new_server(endpoint, "csi")
    adapter = Adapter(log, volume_of, MUTATING, InProgress("volume"), counts)
    identity = Identity(plugin, controller="controller" in services)
    add = csi_pb2_grpc
    add.add_IdentityServicer_to_server(adapter.servicer(identity, add.IdentityServicer), server)
    if "controller" in services:
        add.add_ControllerServicer_to_server(
            adapter.servicer(Controller(plugin), add.ControllerServicer), server
        )
    if "node" in services:
        add.add_NodeServicer_to_server(adapter.servicer(Node(plugin), add.NodeServicer), server)
    return server


def parse_services(text: str) -> tuple[str, ...]:
    chosen = tuple(s.strip() for s in text.split(",") if s.strip())
    wrong = [s for s in chosen if s not in SERVICES]
    if wrong or not chosen:
        raise UsageError(f"invalid --services {text!r}: a comma-separated list of {', '.join(SERVICES)}")
    return chosen


def _recover(repo: Repository) -> None:
    from casfs.upkeep.recovery import recover

    for message in recover(repo):
        log.info("recovered: %s", message)


def serve(
    store: str,
    endpoint: str | None,
    node_id: str | None,
    services: str,
    max_volumes: int = 0,
    metrics_address: str | None = None,
    registry: str | None = None,
    reach: str | None = None,
    bwlimit: int | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT; then finish the RPCs in flight (a grace period).
    `metrics_address` (ADDR:PORT): Prometheus metrics of the RPCs served there.
    `registry` (or $CASFS_REGISTRY): replicated volumes; the node's replica agent runs
    in a thread of this process, reached by the others at `reach` (default: the store)."""
    from casfs.upkeep.recovery import recover

    if not endpoint:
        raise UsageError("an endpoint is required (--endpoint unix:///PATH)")
    if not node_id:
        raise UsageError("a node id is required (--node-id)")
    chosen = parse_services(services)
    address = None
    if metrics_address is not None:
        try:
            address = metrics.parse_address(metrics_address)
        except ValueError as e:
            raise UsageError(str(e)) from None
    repo = Repository.open(Path(os.path.abspath(store)))
    for message in recover(repo):
        log.info("recovered: %s", message)
    counts = metrics.RpcCounts() if address is not None else None
    reg = configured(registry)
    agent = None
    if reg is not None:
        agent = Agent(reg, node_id, str(repo.dir), reach or str(repo.dir), None, bwlimit, _recover)
        threading.Thread(target=agent.run, name="replica-agent", daemon=True).start()
    server = build(Plugin(repo, node_id, max_volumes, reg), chosen, endpoint, counts)
    stop_metrics = None
    if address is not None and counts is not None:
        stop_metrics = metrics.serve(address, metrics.RpcCollector(node_id, counts))
        log.info("metrics on http://%s:%d/metrics", *address)
    log.info("serving %s for node %s on %s (store %s)", ",".join(chosen), node_id, endpoint, repo.dir)
    try:
        run_until_signalled(server, endpoint)
    finally:
        if stop_metrics is not None:
            stop_metrics()
        if agent is not None:
            agent.stop()
        repo.close()
    log.info("stopped")
    return 0
