"""The CSI plugin with a registry: its replica agent runs inside `casfs csi serve`, and
NodeStageVolume of a replicated volume read/write takes `active` (refused elsewhere
meanwhile); NodeUnstageVolume's snapshot reaches the other nodes."""

from __future__ import annotations

import json

from tests.helpers.csi import create, mount_cap, plugin_running, stage, unstage
from tests.helpers.snapshots import wait_until
from tests.replica.cluster import Cluster, cluster, etcd

__all__ = ["cluster", "etcd"]


def test_stage_takes_active_and_unstage_is_followed(cluster: Cluster) -> None:
    c = cluster
    n1 = c.nodes["n1"]
    kubelet = c.tmp / "kubelet"
    with plugin_running(n1.store, kubelet, "--registry", c.registry, "--reach", str(n1.store)) as p:
        vid = create(p, "pvc-r", mount_cap()).volume_id
        (name,) = [v["name"] for v in json.loads(c.ok("n1", "volume", "ls", "--json"))]
        c.ok("n1", "replica", "set-factor", name, "3")
        for node in ("n2", "n3"):
            c.start_agent(node)
        wait_until("three entries, the plugin's own among them", lambda: len(c.replicas(name)) == 3)
        assert p.node_id in c.replicas(name)
        staging = kubelet / "staging" / "pvc-r"
        stage(p, vid, staging, mount_cap())
        assert c.record(name)["active"] == p.node_id
        _, refused = c.mount("n2", name)
        assert refused.returncode == 4 and p.node_id in refused.stderr, refused.stderr
        (staging / "f").write_text("staged on the plugin's node")
        unstage(p, vid, staging)
        assert c.record(name)["active"] is None
        wait_until("the unstage's snapshot on n2 and n3", lambda: c.all_hold(name, 1, ("n2", "n3")))
        shown, done = c.mount("n3", name, "--ro")
        assert done.returncode == 0, done.stderr
        assert (shown / "f").read_text() == "staged on the plugin's node"
        assert c.umount("n3", shown).returncode == 0
        assert p.stop() == 0, p.log()
