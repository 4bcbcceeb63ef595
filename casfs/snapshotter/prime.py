"""`casfs snapshotter prime IMAGE`: tell containerd that the layers of an image casfs
holds are unpacked already, so that `ctr images import` or `ctr run` of it unpacks
nothing.

containerd's unpacker asks a snapshotter for a layer's snapshot labelled
`containerd.io/snapshot.ref` = its chain id, and a snapshotter that has it answers
AlreadyExists (the remote-snapshot convention of stargz and nydus): containerd then
records the committed snapshot in its own metadata, in the caller's namespace. `ctr`
never sends that label (its import and pull apply every layer), so this command sends
those Prepares itself, through containerd's Snapshots service (the same API, with
containerd's namespace header): afterwards containerd finds each chain, skips it, and
only copies the image's blobs into its content store.

The primed snapshots are held by a lease of containerd's that expires (`--expires`,
10 minutes by default): until the image is imported (containerd's import marks its top
chain as used) nothing else holds them, and containerd's garbage collection would remove
them. An import after the lease expired unpacks as without priming (slower, never wrong).
"""

from __future__ import annotations

import datetime
import secrets
from dataclasses import dataclass

import grpc

from casfs import images
from casfs.errors import CasfsError, UsageError
from casfs.grpcsvc.server import socket_path
from casfs.importers.oci.importer import chain_ids
from casfs.repo import Repository
from casfs.snapshotter.proto import leases_pb2, leases_pb2_grpc, snapshots_pb2_grpc
from casfs.snapshotter.proto import snapshots_pb2 as pb
from casfs.snapshotter.service import REF_LABEL

NAMESPACE_HEADER = "containerd-namespace"
LEASE_HEADER = "containerd-lease"
EXPIRE_LABEL = "containerd.io/gc.expire"
Meta = tuple[tuple[str, str], ...]


@dataclass
class Primed:
    chain_id: str
    already: bool  # containerd had it (primed or unpacked before)


def image_chains(repo: Repository, image: str) -> list[str]:
    """The chain ids of an OCI image's layers, first layer first."""
    info = images.get_image(repo, image)
    if not info.oci:
        raise UsageError(f"image {image!r} is not an OCI image: containerd has no layers of it")
    return chain_ids([layer["diff_id"] for layer in info.oci.get("layers", [])])


def prime(
    repo: Repository, image: str, containerd: str, namespace: str, snapshotter: str, expires_s: float = 600.0
) -> list[Primed]:
    chains = image_chains(repo, image)
    with grpc.insecure_channel(f"unix://{socket_path(containerd)}") as channel:
        lease = _lease(channel, namespace, expires_s)
        meta = ((NAMESPACE_HEADER, namespace), (LEASE_HEADER, lease))
        stub = snapshots_pb2_grpc.SnapshotsStub(channel)
        done = []
        parent = ""
        for chain in chains:
            done.append(Primed(chain, _has(stub, snapshotter, chain, meta)))
            if not done[-1].already:
                _prepare(stub, snapshotter, chain, parent, meta)
            parent = chain
    return done


def _lease(channel: grpc.Channel, namespace: str, expires_s: float) -> str:
    """A new lease of containerd's, expiring in `expires_s`; its id."""
    expire = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=expires_s)
    request = leases_pb2.CreateRequest(
        id=f"casfs-prime-{secrets.token_hex(8)}",
        labels={EXPIRE_LABEL: expire.strftime("%Y-%m-%dT%H:%M:%SZ")},
    )
    try:
        made = leases_pb2_grpc.LeasesStub(channel).Create(request, metadata=((NAMESPACE_HEADER, namespace),))
    except grpc.RpcError as e:
        raise CasfsError(f"containerd: creating a lease: {e.details()}") from None
    return str(made.lease.id)


def _has(stub: snapshots_pb2_grpc.SnapshotsStub, sn: str, chain: str, meta: Meta) -> bool:
    try:
        stub.Stat(pb.StatSnapshotRequest(snapshotter=sn, key=chain), metadata=meta)
        return True
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            return False
        raise CasfsError(f"containerd: {e.details()}") from None


def _prepare(stub: snapshots_pb2_grpc.SnapshotsStub, sn: str, chain: str, parent: str, meta: Meta) -> None:
    key = f"casfs-prime-{secrets.token_hex(4)} {chain}"
    request = pb.PrepareSnapshotRequest(snapshotter=sn, key=key, parent=parent, labels={REF_LABEL: chain})
    try:
        stub.Prepare(request, metadata=meta)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.ALREADY_EXISTS:
            return  # (the convention's answer: containerd recorded the chain's snapshot)
        raise CasfsError(f"containerd: preparing chain {chain}: {e.details()}") from None
    # A snapshotter that does not hold it made an empty one: not a layer, removed.
    stub.Remove(pb.RemoveSnapshotRequest(snapshotter=sn, key=key), metadata=meta)
    raise CasfsError(f"snapshotter {sn!r} does not hold chain {chain} (is it casfs, on this store?)")
