"""`casfs csi serve`: the gRPC server on a unix socket, over the three servicers.

The adapter is thin: each RPC is the servicer's method of the same name, called with
the request; around it, three things every RPC gets the same way:

- the in-progress lock: a second RPC that changes a volume while one is in progress
  for the same volume id gets ABORTED ("an operation is pending for volume …"), not a
  second attempt. In this process the lock is a set of volume ids; across processes and
  restarts, the volume's phase in the catalog (creating, deleting, mounted) is the lock.
- errors mapped through codes.py, one table;
- one log line: method, volume id, code, milliseconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from casfs import metrics
from casfs.csi import naming
from casfs.csi.codes import Pending, message_of, status_of
from casfs.csi.controller import Controller
from casfs.csi.identity import Identity
from casfs.csi.node import Node
from casfs.csi.plugin import Plugin
from casfs.csi.proto import csi_pb2_grpc
from casfs.errors import CasfsError, UsageError
from casfs.metrics import RpcCounts
from casfs.replica.agent import Agent
from casfs.replica.registry import configured
from casfs.repo import Repository

log = logging.getLogger("casfs.csi")
WORKERS = 8
STOP_GRACE_S = 10.0
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


class InProgress:
    """The volume ids an RPC is changing now, in this process."""

    def __init__(self) -> None:
        self._held: set[str] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def hold(self, volume_id: str) -> Iterator[None]:
        with self._lock:
            if volume_id in self._held:
                raise Pending(f"an operation is pending for volume {volume_id!r}")
            self._held.add(volume_id)
        try:
            yield
        finally:
            with self._lock:
                self._held.discard(volume_id)


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


def adapt(handler: object, base: type[Any], locks: InProgress, counts: RpcCounts | None = None) -> Any:
    """An instance of the generated servicer `base` whose every RPC calls the method
    of `handler` of the same name. (Any: the generated stubs declare the servicers'
    methods abstract, which a class made at run time cannot show mypy it overrides.)"""
    methods = {
        name: _rpc(name, getattr(handler, name), locks, counts)
        for name in dir(base)
        if not name.startswith("_") and callable(getattr(handler, name, None))
    }
    return type(f"{base.__name__}Adapter", (base,), methods)()


def _rpc(
    name: str, fn: Callable[[Any], Any], locks: InProgress, counts: RpcCounts | None
) -> Callable[[Any, Any, grpc.ServicerContext], Any]:
    def call(self: object, request: Any, context: grpc.ServicerContext) -> Any:
        volume = volume_of(name, request)
        start = time.monotonic()
        code = grpc.StatusCode.OK
        try:
            with locks.hold(volume) if volume and name in MUTATING else contextlib.nullcontext():
                return fn(request)
        except Exception as e:
            code = status_of(e)
            if code == grpc.StatusCode.INTERNAL and not isinstance(e, CasfsError):
                log.exception("%s: unexpected error", name)
            context.abort(code, message_of(e))
        finally:
            seconds = time.monotonic() - start
            log.info("%s volume=%s code=%s %.1f ms", name, volume or "-", code.name, seconds * 1000)
            if counts is not None:
                counts.rpc(name, code.name, seconds)

    call.__name__ = name
    return call


def socket_path(endpoint: str) -> str:
    """unix:///PATH (or unix:/PATH) -> PATH."""
    prefix = "unix://" if endpoint.startswith("unix://") else "unix:"
    path = endpoint[len(prefix) :] if endpoint.startswith(prefix) else ""
    if path.startswith("/") and not path.startswith("//"):
        return path
    raise UsageError(f"invalid endpoint {endpoint!r}: expected unix:///PATH")


def _free_socket(path: str) -> None:
    """A socket left by a killed plugin is removed; anything else there is refused."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return
    if not stat.S_ISSOCK(mode):
        raise UsageError(f"{path} exists and is not a socket")
    os.unlink(path)


def build(
    plugin: Plugin, services: tuple[str, ...], endpoint: str, counts: RpcCounts | None = None
) -> grpc.Server:
    """The server, its servicers added and its socket bound (not started); `counts`:
    each RPC counted there (--metrics)."""
    path = socket_path(endpoint)
    _free_socket(path)
    locks = InProgress()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="csi"))
    identity = Identity(plugin, controller="controller" in services)
    add = csi_pb2_grpc
    add.add_IdentityServicer_to_server(adapt(identity, add.IdentityServicer, locks, counts), server)
    if "controller" in services:
        servicer = adapt(Controller(plugin), add.ControllerServicer, locks, counts)
        add.add_ControllerServicer_to_server(servicer, server)
    if "node" in services:
        add.add_NodeServicer_to_server(adapt(Node(plugin), add.NodeServicer, locks, counts), server)
    server.add_insecure_port(f"unix://{path}")
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
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    log.info("serving %s for node %s on %s (store %s)", ",".join(chosen), node_id, endpoint, repo.dir)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop(STOP_GRACE_S).wait()
        if stop_metrics is not None:
            stop_metrics()
        if agent is not None:
            agent.stop()
        repo.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path(endpoint))
    log.info("stopped")
    return 0
