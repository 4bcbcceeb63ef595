"""`casfs csi serve --metrics`: the RPCs served, scraped and parsed with
prometheus_client's own parser."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from casfs.csi.proto import csi_pb2 as pb
from tests.helpers.cli import fails
from tests.helpers.csi import mount_cap, plugin_running


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def samples(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_plugin_counts_its_rpcs(store: Path, kubelet: Path) -> None:
    port = free_port()
    with plugin_running(store, kubelet, "--metrics", f"127.0.0.1:{port}") as p:
        request = pb.CreateVolumeRequest(name="m1", volume_capabilities=[mount_cap()])
        p.controller.CreateVolume(request)
        p.controller.CreateVolume(request)  # (a repeat: OK again)
        with pytest.raises(grpc.RpcError):
            p.controller.DeleteVolume(pb.DeleteVolumeRequest())  # no id: INVALID_ARGUMENT
        p.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id="m1"))
        got = samples(port)
        assert p.stop() == 0
    node = ("node", "node-1")

    def n(name: str, **labels: str) -> float:
        return got.get((name, frozenset({node, *labels.items()})), 0.0)

    assert n("casfs_csi_requests_total", method="CreateVolume", code="OK") == 2
    assert n("casfs_csi_requests_total", method="DeleteVolume", code="INVALID_ARGUMENT") == 1
    assert n("casfs_csi_requests_total", method="DeleteVolume", code="OK") == 1
    assert n("casfs_csi_request_seconds_count", method="CreateVolume") == 2
    assert n("casfs_csi_request_seconds_bucket", method="CreateVolume", le="+Inf") == 2


def test_a_bad_metrics_address_is_refused(store: Path, kubelet: Path) -> None:
    line = fails(
        store, 2, "csi", "serve", "--endpoint", f"unix://{kubelet}/csi.sock", "--node-id", "n",
        "--metrics", "nowhere",
    )  # fmt: skip
    assert "invalid metrics address" in line
