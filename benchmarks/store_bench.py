#!/usr/bin/env python3
"""The figures the local blob store bounds, for two casfs checkouts side by side (a
change and what it changes), interleaved in one run: casfs's own steps of
image_bench.py and block_bench.py, without their peers (whose figures do not change
with casfs's code; take them from those benchmarks' runs).

    cd / && python /PATH/benchmarks/store_bench.py --casfs OLD,NEW [--tree /usr/share]
        [--size 1G] [--fold 1G] [--reps 2] [--workdir DIR] [--json]

(From /: `python -m casfs` puts the working directory first on the path.) Sources as
image_bench.py's: a copy of --tree and a generated mixed image of --size. Each
repetition, for each checkout in turn (the order rotates), a fresh store, page cache
dropped before each step:

  import tree      `casfs image import tree SRC/tree`, MB/s
  import disk      `casfs image import disk SRC/disk.img`, MB/s
  seq read cold    the whole-store mount just made, dd bs=1M of images/disk, MB/s
  daemon peak RSS  that daemon's VmHWM after the read, MiB
  fold             a volume cloned from the image, mounted on a file; --fold of random
                   bytes written (1 MiB O_DIRECT, one fdatasync), then a snapshot by
                   setfattr, timed until its background fold has stored it (as
                   block_bench.py's "fold rate"), MB/s

Ratios are the second checkout over the first. Run as root (drop_caches, mounts).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import benchlib as bl
from block_bench import CasfsDisk, write_random
from image_bench import tree_bytes

from casfs.units import parse_size

# step -> (unit, higher is better)
STEPS = {
    "import tree": ("MB/s", True),
    "import disk": ("MB/s", True),
    "seq read cold": ("MB/s", True),
    "daemon peak RSS": ("MiB", False),
    "fold": ("MB/s", True),
}


def _timed(fn: Any) -> float:
    bl.drop_caches()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def one(checkout: str, work: Path, src: Path, sizes: dict[str, int], fold: int) -> dict[str, float]:
    """Every step on a fresh store, with the casfs of `checkout`."""
    os.environ["PYTHONPATH"] = checkout
    store = work / "store"
    bl.sh("rm", "-rf", store)
    cas = bl.Casfs(store, work / "mnt")
    cas.cli("init")
    figures = {}
    for source, path in (("tree", src / "tree"), ("disk", src / "disk.img")):
        secs = _timed(lambda s=source, p=path: cas.cli("image", "import", s, p, timeout=3600))
        figures[f"import {source}"] = sizes[source] / secs / 1e6
    (work / "mnt").mkdir(exist_ok=True)
    bl.drop_caches()
    with cas.mounted() as mnt:
        t = time.perf_counter()
        bl.sh("dd", f"if={mnt / 'images' / 'disk'}", "of=/dev/null", "bs=1M", timeout=3600)
        figures["seq read cold"] = sizes["disk"] / (time.perf_counter() - t) / 1e6
        figures["daemon peak RSS"] = bl.memory_kib(cas.pid()).get("VmHWM", 0) / 1024
    vol = bl.Casfs(store, work / "vol.img", volume="v")
    vol.cli("volume", "create", "v", "--from", "disk")
    vol.mnt.touch()
    with vol.mounted():
        disk = CasfsDisk(vol)
        write_random(disk.path, fold)
        t = time.perf_counter()
        disk.snapshot("folded")
        disk.wait_folded()
        figures["fold"] = fold / (time.perf_counter() - t) / 1e6
    print(f"  {checkout}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()), file=sys.stderr)
    return figures


def main() -> int:
    p = bl.arguments(__doc__)
    p.add_argument("--casfs", required=True, help="two checkouts, comma-separated: OLD,NEW")
    p.add_argument("--tree", default="/usr/share")
    p.add_argument("--size", default="1G")
    p.add_argument("--fold", default="1G", help="bytes written before the folded snapshot")
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args()
    bl.stop_on_sigterm()
    checkouts = args.casfs.split(",")
    size, fold = parse_size(args.size), parse_size(args.fold)
    samples: dict[str, dict[str, list[float]]] = {s: {c: [] for c in checkouts} for s in STEPS}
    with bl.scratch(args.workdir, "store-bench-", mounts=("mnt", "vol.img")) as work:
        src = work / "src"
        src.mkdir()
        bl.sh("cp", "-a", args.tree, src / "tree", timeout=1800)
        bl.generate(src / "disk.img", size, seed=1, runs="zrt")
        entries, tree_size = tree_bytes(src / "tree")
        sizes = {"tree": tree_size, "disk": size}
        for rep in range(args.reps):
            for checkout in checkouts[rep % 2 :] + checkouts[: rep % 2]:
                for step, value in one(checkout, work, src, sizes, fold).items():
                    samples[step][checkout].append(value)
    medians = {s: {c: statistics.median(v) for c, v in by.items()} for s, by in samples.items()}
    old, new = checkouts
    rows = [
        bl.Row(s, unit, {"old": medians[s][old], "casfs": medians[s][new]}, up)
        for s, (unit, up) in STEPS.items()
    ]
    report = {"casfs": checkouts, "entries": entries, "sizes": sizes, "fold": fold, "samples": samples}
    heading = (
        f"{entries} entries, {tree_size // bl.MIB} MiB tree; {size // bl.MIB} MiB image; "
        f"median of {args.reps}; old = {old}, casfs = {new}"
    )
    bl.emit(report, args.json, heading, bl.table(rows, ("old", "casfs"), ("old",)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
