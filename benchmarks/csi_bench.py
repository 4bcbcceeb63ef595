#!/usr/bin/env python3
"""How long do the CSI plugin's provisioning RPCs take, next to a qcow2 clone and a copy?

    python benchmarks/csi_bench.py [--size 1G] [--runs 50] [--mounts 20] [--copies 3] [--workdir DIR] [--json]

Sets up a store with a generated image of --size (benchlib.generate: a third zeros, a
third random, a third text, in 1 MiB runs) imported as a raw image, starts `casfs csi
serve` on a unix socket, and times each as a gRPC round trip from a client in this
process, median of --runs (each with a new name, so none is a repeat):

    CreateVolume image      a block volume from the image (parameters image=…): O(1)
    CreateSnapshot          a snapshot of a volume at rest (the first of a state also alone:
                            size_bytes walks its metadata once, csi/figures.py)
    CreateVolume snapshot   a block volume from that snapshot (content source): O(1)
    qemu-img create -b      a qcow2 overlay over the raw image (the cost of a qcow2 clone)
    cp --reflink=never      a full copy of the image, fsync'd (median of --copies: O(size))
    stage+publish           NodeStageVolume + NodePublishVolume of a block volume from the
                            image to a loop device a pod can open (its first 4 KiB read),
                            median of --mounts; unpublish+unstage untimed

Targets (issue 28): the three RPCs at most 10 ms whatever the volume's size, stage +
publish at most 1 s.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from benchlib import arguments, emit, generate, scratch

from casfs import images
from casfs.csi.proto import csi_pb2 as pb
from casfs.csi.proto import csi_pb2_grpc as rpc
from casfs.repo import Repository
from casfs.units import format_size, parse_size

Mode = pb.VolumeCapability.AccessMode
BLOCK = pb.VolumeCapability(
    block=pb.VolumeCapability.BlockVolume(), access_mode=Mode(mode=Mode.SINGLE_NODE_WRITER)
)
TARGETS_MS = {"CreateVolume image": 10.0, "CreateSnapshot": 10.0, "CreateVolume snapshot": 10.0}
STAGE_TARGET_MS = 1000.0


@contextlib.contextmanager
def plugin(store: Path, work: Path) -> Iterator[tuple[rpc.ControllerStub, rpc.NodeStub]]:
    sock = work / "csi.sock"
    cmd = [sys.executable, "-m", "casfs", "-s", str(store), "csi", "serve"]
    cmd += ["--endpoint", f"unix://{sock}", "--node-id", "bench", "--log-level", "warning"]
    with open(work / "plugin.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the plugin did not start: {(work / 'plugin.log').read_text()}")
            time.sleep(0.02)
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            yield rpc.ControllerStub(channel), rpc.NodeStub(channel)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def median_ms(fn: Callable[[int], Any], runs: int, first: list[float] | None = None) -> tuple[float, float]:
    """(median, max) milliseconds of fn(i) over `runs` (the first one's also put in `first`)."""
    times = []
    for i in range(runs):
        t = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t) * 1000)
    if first is not None:
        first.append(times[0])
    return statistics.median(times), max(times)


def main() -> int:
    p = arguments(__doc__)
    p.add_argument("--size", default="1G")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--mounts", type=int, default=20)
    p.add_argument("--copies", type=int, default=3)
    args = p.parse_args()
    size = parse_size(args.size)
    with scratch(args.workdir, "csi-bench-") as work:
        image, store, kubelet = work / "image.raw", work / "store", work / "kubelet"
        generate(image, size, seed=28, runs="zrt")
        with contextlib.closing(Repository.init(store)) as repo:
            images.import_image(repo, "img", image)
        figures: dict[str, tuple[float, float]] = {}
        try:
            with plugin(store, work) as (controller, node):
                figures.update(provisioning(controller, args.runs))
                figures["stage+publish"] = stage_publish(controller, node, kubelet, args.mounts)
        finally:
            cleanup(kubelet)
        figures.update(peers(image, work, args.runs, args.copies))
    report = {
        "size": size,
        "runs": args.runs,
        "figures_ms": {k: {"median": v[0], "max": v[1]} for k, v in figures.items()},
        "targets_ms": {**TARGETS_MS, "stage+publish": STAGE_TARGET_MS},
    }
    qemu = figures["qemu-img create -b"][0]
    lines = [
        f"CSI provisioning, a {format_size(size)} image, median of {args.runs} "
        f"(stage+publish: {args.mounts})",
        "",
    ]
    lines.append(f"{'step':30} {'median ms':>10} {'max ms':>9} {'/qemu-img':>10} {'target':>9}")
    for name, (median, worst) in figures.items():
        target = {**TARGETS_MS, "stage+publish": STAGE_TARGET_MS}.get(name)
        verdict = "" if target is None else ("met" if median <= target else "MISSED") + f" {target:.0f}"
        lines.append(f"{name:30} {median:10.2f} {worst:9.2f} {median / qemu:9.2f}x {verdict:>9}")
    emit(report, args.json, *lines)
    return 0


def provisioning(controller: rpc.ControllerStub, runs: int) -> dict[str, tuple[float, float]]:
    def from_image(i: int) -> None:
        controller.CreateVolume(
            pb.CreateVolumeRequest(name=f"img-{i}", volume_capabilities=[BLOCK], parameters={"image": "img"})
        )

    def snapshot(i: int) -> None:
        controller.CreateSnapshot(pb.CreateSnapshotRequest(source_volume_id="img-0", name=f"snap-{i}"))

    def from_snapshot(i: int) -> None:
        source = pb.VolumeContentSource(snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id="img-0@1"))
        request = pb.CreateVolumeRequest(
            name=f"snap-{i}", volume_capabilities=[BLOCK], volume_content_source=source
        )
        controller.CreateVolume(request)

    first: list[float] = []
    figures = {
        "CreateVolume image": median_ms(from_image, runs),
        "CreateSnapshot": median_ms(snapshot, runs, first),
        "CreateVolume snapshot": median_ms(from_snapshot, runs),
    }
    # The first snapshot of a root pays Snapshot.size_bytes' metadata walk (csi/figures.py):
    # O(the volume's metadata) once per state; the others share that root's figure.
    figures["CreateSnapshot, 1st of a root"] = (first[0], first[0])
    return figures


def stage_publish(
    controller: rpc.ControllerStub, node: rpc.NodeStub, kubelet: Path, runs: int
) -> tuple[float, float]:
    times = []
    for i in range(runs):
        vid, staging, target = f"img-{i}", kubelet / "staging" / f"v{i}", kubelet / "pods" / f"p{i}" / "dev"
        t = time.perf_counter()
        node.NodeStageVolume(
            pb.NodeStageVolumeRequest(
                volume_id=vid, staging_target_path=str(staging), volume_capability=BLOCK
            )
        )
        node.NodePublishVolume(
            pb.NodePublishVolumeRequest(
                volume_id=vid,
                staging_target_path=str(staging),
                target_path=str(target),
                volume_capability=BLOCK,
            )
        )
        with open(target, "rb") as f:
            f.read(4096)
        times.append((time.perf_counter() - t) * 1000)
        node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vid, target_path=str(target)))
        node.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=vid, staging_target_path=str(staging)))
    return statistics.median(times), max(times)


def peers(image: Path, work: Path, runs: int, copies: int) -> dict[str, tuple[float, float]]:
    def qcow2(i: int) -> None:
        out = work / f"overlay-{i}.qcow2"
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(image), "-F", "raw", str(out)], check=True
        )

    def copy(i: int) -> None:
        out = work / f"copy-{i}.raw"
        subprocess.run(["cp", "--reflink=never", str(image), str(out)], check=True)
        fd = os.open(out, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        out.unlink()

    return {"qemu-img create -b": median_ms(qcow2, runs), "cp --reflink=never": median_ms(copy, copies)}


def cleanup(kubelet: Path) -> None:
    """Binds and loop devices a failed run left (the plugin's unpublish removes them)."""
    from casfs.fuse.mountinfo import mounts

    for m in reversed([m for m in mounts() if m.mountpoint.startswith(f"{kubelet}/")]):
        subprocess.run(["umount", "-l", m.mountpoint], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
