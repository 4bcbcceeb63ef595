"""What every servicer shares: the store, this node, and where the store's volumes are
mounted (the run files of live daemons: nothing the plugin keeps in memory only)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from casfs.csi.proto import csi_pb2 as pb
from casfs.fuse.launcher import live_mounts
from casfs.replica.registry import Registry
from casfs.repo import Repository

DRIVER_NAME = "csi.casfs.dev"
TOPOLOGY_KEY = "topology.csi.casfs.dev/node"


@dataclass
class Plugin:
    repo: Repository  # one connection per gRPC worker thread (Repository.conn)
    node_id: str
    max_volumes_per_node: int = 0  # 0: no limit
    registry: Registry | None = None  # replicated volumes: `active` taken at stage, released at unstage

    @property
    def store(self) -> Path:
        return self.repo.path

    def topology(self) -> pb.Topology:
        return pb.Topology(segments={TOPOLOGY_KEY: self.node_id})

    def reachable(self, requirement: pb.TopologyRequirement) -> bool:
        """Whether a volume here satisfies `requirement`: no requisite topology, or one
        that names this node (or does not name a node at all)."""
        wanted = list(requirement.requisite)
        return not wanted or any(t.segments.get(TOPOLOGY_KEY, self.node_id) == self.node_id for t in wanted)

    def mountpoint(self, volume: str) -> str | None:
        """Where a live daemon serves `volume` alone (its staging mount), if anywhere."""
        return live_mounts(self.store).get(volume)
