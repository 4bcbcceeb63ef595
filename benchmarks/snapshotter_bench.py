"""containerd on casfs next to containerd's own overlayfs snapshotter, on one containerd,
one machine and one image (a static busybox and a copy of host trees, built with umoci):

  start     `ctr run --rm` of /bin/true (Prepare, mounts, runc run, exit), median of --runs
  runnable  time from nothing to an image `ctr run` can start: `ctr images import` with
            overlayfs; with casfs not holding the layers; with casfs holding them
            (`casfs snapshotter prime` + `ctr images import`, the layers imported by
            `casfs image import` beforehand, not counted); and `--no-unpack` (the blobs
            copied into containerd's content store, which every import does), so that
            the unpack's share is the rest
  disk      10 running containers of the image, each writing 1 MiB of random bytes: what
            the store's directory (blobs, upper files, catalog) or overlayfs's snapshot
            directory grew by, against the image's own bytes

    sudo .venv/bin/python benchmarks/snapshotter_bench.py [--runs 20] [--trees /usr/lib/python3.11]
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import arguments, emit

from tests.snapshotter.build import archive, build_busybox
from tests.snapshotter.stack import REF, Stack, running


def seconds(fn: Any) -> float:
    t = time.monotonic()
    fn()
    return time.monotonic() - t


def start_median(s: Stack, snapshotter: str, runs: int, namespace: str) -> float:
    times = []
    for i in range(runs):
        times.append(seconds(lambda i=i: s.ctr("run", "--rm", "--snapshotter", snapshotter, REF, f"t{i}",
                                               "/bin/true", namespace=namespace)))  # fmt: skip
    s.gc(namespace)
    return statistics.median(times)


def du(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def disk_of_ten(s: Stack, snapshotter: str, namespace: str, measure: Callable[[], int]) -> int:
    before = measure()
    for i in range(10):
        s.ctr(
            "run", "-d", "--snapshotter", snapshotter, REF, f"d{i}", "/bin/sleep", "1000", namespace=namespace
        )
        s.ctr("tasks", "exec", "--exec-id", "w", f"d{i}", "/bin/sh", "-c",
              "head -c 1048576 /dev/urandom > /data/mine; sync", namespace=namespace)  # fmt: skip
    for i in range(10):  # (casfs: folded when the daemon is unmounted, as at a commit)
        s.ctr("tasks", "kill", "-s", "SIGKILL", f"d{i}", namespace=namespace, check=False)
    for i in range(10):
        name = f"d{i}"
        s.wait("stopped", lambda: s.task_status(name, namespace) in (None, "STOPPED"))  # noqa: B023 (waited on here)
    grown: int = measure() - before
    for i in range(10):
        s.end(f"d{i}", namespace)
    return grown


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--trees", nargs="*", default=["/usr/lib/python3.11"])
    args = ap.parse_args()
    with running(parent=args.workdir) as s:
        layout = build_busybox(s.base / "img", trees=tuple(args.trees))
        tar = archive(layout, s.base / "img" / "image.tar")
        imp = ("images", "import", "--base-name", "example.com/bb", str(tar))
        r: dict[str, float] = {}
        # (the blobs copied into containerd's content store alone: what every import costs)
        r["ingest only"] = seconds(lambda: s.ctr(*imp[:2], "--no-unpack", *imp[2:], namespace="ingest"))
        r["overlayfs"] = seconds(
            lambda: s.ctr(*imp[:2], "--snapshotter", "overlayfs", *imp[2:], namespace="ovl")
        )
        r["casfs"] = seconds(lambda: s.ctr(*imp[:2], "--snapshotter", "casfs", *imp[2:], namespace="cas"))
        s.casfs("image", "import", "held", f"oci:{layout}:v1")
        sock = f"unix://{s.containerd_socket}"

        def held() -> None:
            s.casfs("snapshotter", "prime", "held", "--containerd", sock, "--namespace", "held")
            s.ctr(*imp[:2], "--snapshotter", "casfs", *imp[2:], namespace="held")

        r["casfs, held"] = seconds(held)
        start = {
            "overlayfs": start_median(s, "overlayfs", args.runs, "ovl"),
            "casfs": start_median(s, "casfs", args.runs, "cas"),
        }
        image_bytes = du(layout / "blobs")
        ovl_dir = s.base / "ctrd-root" / "io.containerd.snapshotter.v1.overlayfs"
        disk = {
            "overlayfs": disk_of_ten(s, "overlayfs", "ovl", lambda: du(ovl_dir)),
            "casfs": disk_of_ten(s, "casfs", "cas", lambda: du(s.store)),  # (blobs, upper files, catalog)
        }
        report = {
            "import_s": r,
            "start_median_s": start,
            "disk_of_10_bytes": disk,
            "image_gz_bytes": image_bytes,
        }
        unpacked = du(ovl_dir)
        lines = [
            f"image: {image_bytes / 1e6:.1f} MB compressed, {unpacked / 1e6:.1f} MB unpacked (overlayfs)",
            "time to runnable after import (s): "
            + ", ".join(f"{k} {v:.2f}" for k, v in r.items())
            + f"  (held/overlayfs {r['casfs, held'] / r['overlayfs']:.2f}x; beyond the ingest: "
            + f"{(r['casfs, held'] - r['ingest only']) / (r['overlayfs'] - r['ingest only']):.2f}x)",
            f"container start, median of {args.runs} (s): overlayfs {start['overlayfs']:.3f}, "
            f"casfs {start['casfs']:.3f}  ({start['casfs'] / start['overlayfs']:.2f}x)",
            "10 containers writing 1 MiB each, disk grown (MB): "
            + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in disk.items()),
        ]
        emit(report, args.json, *lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
