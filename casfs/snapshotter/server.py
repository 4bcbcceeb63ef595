"""`casfs snapshotter serve`: containerd's Snapshots service on a unix socket, for
containerd's `[proxy_plugins.casfs]` (type "snapshot")."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import grpc

from casfs.grpcsvc.server import Adapter, InProgress, new_server, run_until_signalled
from casfs.repo import Repository
from casfs.snapshotter.proto import snapshots_pb2_grpc
from casfs.snapshotter.service import Snapshotter
from casfs.snapshotter.servicer import Snapshots

log = logging.getLogger("casfs.snapshotter")
DEFAULT_ROOT = "/run/casfs-snapshotter"
# RPCs that change a snapshot: taken under its key's lock (reads are answered meanwhile).
MUTATING = frozenset({"Prepare", "View", "Commit", "Remove", "Update"})


def key_of(method: str, request: Any) -> str:
    """The key an RPC changes: Commit's is the active key it commits."""
    if method == "Update":
        return str(request.info.name)
    return str(getattr(request, "key", ""))


def build(snapshotter: Snapshotter, endpoint: str) -> grpc.Server:
    server, _ = new_server(endpoint, "snapshotter")
    adapter = Adapter(log, key_of, MUTATING, InProgress("snapshot"))
    servicer = adapter.servicer(Snapshots(snapshotter), snapshots_pb2_grpc.SnapshotsServicer)
    snapshots_pb2_grpc.add_SnapshotsServicer_to_server(servicer, server)
    return server


def serve(store: str, address: str, root: str | None) -> int:
    """Recover, then serve until SIGTERM or SIGINT. `root`: where snapshots are mounted."""
    from casfs.upkeep.recovery import recover

    repo = Repository.open(Path(os.path.abspath(store)))
    for message in recover(repo):
        log.info("recovered: %s", message)
    mounts = Path(os.path.abspath(root or DEFAULT_ROOT)) / "mounts"
    mounts.mkdir(parents=True, exist_ok=True)
    # (root's only, as containerd's own snapshot directories: the store mount, allow_other,
    # shows every container's rootfs; the runtime's binds of it are mounts of their own)
    os.chmod(mounts, 0o700)
    sn = Snapshotter(repo, mounts)
    for message in sn.recover():
        log.info("recovered: %s", message)
    server = build(sn, address)
    log.info("serving containerd snapshots on %s (store %s, mounts in %s)", address, repo.dir, mounts)
    try:
        run_until_signalled(server, address)
    finally:
        repo.close()
    log.info("stopped")
    return 0
