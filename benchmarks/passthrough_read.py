#!/usr/bin/env python3
"""Reads of an image's files on a read-only mount, with and without FUSE passthrough.

    python benchmarks/passthrough_read.py [--files 32] [--file-size 16M] [--reps 3]
                                          [--workdir DIR] [--json]

A tree of --files files of --file-size (image_bench's mix: zeros, random, text in 1 MiB
runs) imported as an image, and the same tree as plain files on this disk (native).
Each repetition, after a drop of the page cache and a fresh mount of the whole store:

  seq read cold     `dd bs=1M` of every file in turn
  rand 4K warm      fio randread 4 KiB qd1 for 3 s of the first file, just read
  rand 4K cold      every 4 KiB block of the last file once, in random order, after
                    another drop of the page cache

through native; casfs --ro with passthrough, first (each file filled into the cache at
its first open: what a first reader pays) and again (the cache filled, the page cache
dropped); and casfs --ro --no-passthrough (every read through the daemon). Medians;
ratios against native. Run as root (passthrough needs CAP_SYS_ADMIN).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import Casfs, arguments, drop_caches, emit, fio, generate, scratch, stop_on_sigterm

PEERS = ("native", "first", "cached", "daemon")


def read_all(files: list[Path]) -> float:
    """MB/s of dd bs=1M over each of `files` in turn."""
    size = sum(p.stat().st_size for p in files)
    t = time.perf_counter()
    for p in files:
        subprocess.run(["dd", f"if={p}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    return size / (time.perf_counter() - t) / 1e6


def rand_iops(path: Path, warm: bool) -> float:
    """fio randread 4 KiB qd1: warm, for 3 s over pages just read; cold, every block of
    the file once in random order (a run of seconds would soon read only cached pages).
    The page cache is left as it is: fio's own drop of a file's pages would reach only
    the FUSE file's, not its backing file's."""
    job = ["--rw=randread", "--bs=4k", "--ioengine=psync", "--invalidate=0"]
    job += ["--runtime=3", "--time_based"] if warm else ["--norandommap=0"]
    return float(fio(path, job, path.stat().st_size)["iops"])


def measure(top: Path) -> dict[str, float]:
    files = sorted(p for p in top.rglob("*") if p.is_file())
    drop_caches()
    seq = read_all(files)
    warm = rand_iops(files[0], warm=True)  # its pages read just now
    drop_caches()
    return {"seq": seq, "rand_warm": warm, "rand_cold": rand_iops(files[-1], warm=False)}


def main() -> int:
    p = arguments(__doc__)
    p.add_argument("--files", type=int, default=32)
    p.add_argument("--file-size", default="16M")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    stop_on_sigterm()
    file_size = int(args.file_size.rstrip("M")) << 20
    results: dict[str, list[dict[str, float]]] = {k: [] for k in PEERS}
    with scratch(args.workdir, "casfs-passthrough-", mounts=("mnt",)) as work:
        native = work / "native"
        native.mkdir()
        for i in range(args.files):
            generate(native / f"f{i:03}", file_size, seed=i, runs="zrt")
        store = work / "store"
        (work / "mnt").mkdir()
        setup = Casfs(store, work / "mnt")
        setup.cli("init")
        setup.cli("image", "import", "files", native)
        for _ in range(args.reps):
            results["native"].append(measure(native))
            shutil.rmtree(store / "cache" / "files", ignore_errors=True)
            for peer, extra in (("first", ()), ("cached", ()), ("daemon", ("--no-passthrough",))):
                cas = Casfs(store, work / "mnt", args=("--ro", *extra))
                with cas.mounted() as mnt:
                    results[peer].append(measure(mnt / "images" / "files"))
    tests = {
        "seq": "seq read cold, MB/s",
        "rand_warm": "rand 4K qd1 warm, IOPS",
        "rand_cold": "rand 4K qd1 cold, IOPS",
    }
    med = {peer: {k: statistics.median(r[k] for r in runs) for k in tests} for peer, runs in results.items()}
    lines = [
        f"{'test':24}" + "".join(f"{p:>10}" for p in PEERS) + "".join(f"{p + '/nat':>12}" for p in PEERS[1:])
    ]
    for key, label in tests.items():
        cells = "".join(f"{med[p][key]:10.0f}" for p in PEERS)
        ratios = "".join(f"{med[p][key] / med['native'][key]:11.2f}x" for p in PEERS[1:])
        lines.append(f"{label:24}{cells}{ratios}")
    report: dict[str, Any] = {"medians": med, "runs": results}
    emit(report, args.json, f"{args.files} files of {args.file_size}, {args.reps} repetitions", *lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
