#!/usr/bin/env python3
"""Per-request cost of a casfs block volume, two casfs source trees side by side.

    python benchmarks/block_ops.py [--trees main=/work/main,new=.] [--size 1G]
                                   [--runtime 5] [--reps 3] [--tests ...] [--warm]
                                   [--chunk-sizes 64K,16K] [--mount-args NAME=ARGS]
                                   [--workdir DIR] [--json]

block_bench.py's random 4 KiB tests (O_DIRECT, qd1 and qd16) on a fresh clone of a
generated image, for each tree in turn (interleaved, the order alternating between
repetitions): the daemon runs that tree's code (PYTHONPATH). Reads start cold (daemon
restarted, page cache dropped), or with --warm after one sequential read of the
whole disk (the store in the page cache: the request machinery without the disk).
Besides IOPS, the daemon's CPU time per request (user and system, from /proc/PID/stat):
on a machine shared with other work, IOPS follow the load, CPU per request much less.
The sequential tests give MB/s and the daemon's CPU per GiB instead: "seq read cold"
fio's MB/s (as block_bench's), "seq write+fsync" (block_bench's order: after the random
writes, on the same disk) MB/s over the wall time, its fsync in it.
The question it answers: did a change make each request cheaper? (block_bench.py
answers how casfs compares with qemu's daemon.) With several --chunk-sizes, the image
is imported once at each, and every tree runs on a clone of each (rows "tree@size").
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import Casfs, arguments, cpu_s, drop_caches, emit, fio, generate, scratch, stop_on_sigterm
from block_bench import TESTS

RANDOM = [t for t in TESTS if t.startswith("rand")]


def _sequential(test: str) -> bool:
    """A test whose figures are MB/s and CPU per GiB (in "iops" and "*_us"), not per request."""
    return test.startswith("seq")


def _cell(test: str, fig: dict[str, float]) -> str:
    if _sequential(test):
        return f"{fig['iops']:8.0f} MB/s {fig['user_us'] / 1e6:5.2f}+{fig['sys_us'] / 1e6:.2f} s CPU/GiB"
    return f"{fig['iops']:8.0f} IOPS {fig['user_us']:5.0f}+{fig['sys_us']:.0f} us CPU"


def run_tree(
    cas: Casfs, tests: list[str], size: int, runtime: int, warm: bool
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    if warm:
        fio(cas.mnt, TESTS["seq read cold"], size)
    for test in tests:
        if "read" in test and not warm:
            cas.umount()
            drop_caches()
            cas.mount()
        pid = cas.pid()
        u0, s0 = cpu_s(pid)
        timed = [f"--runtime={runtime}"] if "--time_based" in TESTS[test] else []
        t = time.perf_counter()
        got = fio(cas.mnt, [*TESTS[test], *timed], size)
        wall = time.perf_counter() - t
        u1, s1 = cpu_s(pid)
        if _sequential(test):  # (block_bench's figures: a write's over the wall time, the fsync in it)
            rate, ops = (size / wall / 1e6 if "write" in test else got["mbps"]), got["bytes"] / (1 << 30)
        else:
            rate, ops = got["iops"], got["bytes"] / 4096
        out[test] = {"iops": rate, "user_us": (u1 - u0) / ops * 1e6, "sys_us": (s1 - s0) / ops * 1e6}
    return out


def main() -> int:
    from casfs.units import parse_size

    p = arguments(__doc__)
    p.add_argument("--trees", default=f"main=/work/main,new={Path(__file__).resolve().parent.parent}")
    p.add_argument("--size", default="1G")
    p.add_argument("--runtime", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tests", default=",".join(RANDOM), help="comma-separated, of: " + ", ".join(TESTS))
    p.add_argument("--warm", action="store_true", help="reads with the store in the page cache")
    p.add_argument("--chunk-sizes", default="64K", help="the image's chunk sizes, comma-separated")
    p.add_argument(
        "--mount-args",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="more `casfs mount` options for tree NAME (e.g. 'on=--metrics 127.0.0.1:9109')",
    )
    args = p.parse_args()
    sizes = args.chunk_sizes.split(",")
    trees = {
        (name if len(sizes) == 1 else f"{name}@{cs}"): (path, f"base{cs}")
        for name, path in (item.split("=", 1) for item in args.trees.split(","))
        for cs in sizes
    }
    extra = {name: value.split() for name, value in (item.split("=", 1) for item in args.mount_args)}
    tests = args.tests.split(",")
    size = parse_size(args.size)
    samples: dict[str, dict[str, list[dict[str, float]]]] = {}
    stop_on_sigterm()
    with scratch(args.workdir, "casfs-blockops-", mounts=("casfs.mnt",)) as work:
        generate(work / "base.raw", size, seed=1, runs="zrt")
        first = Casfs(work / "store", work / "casfs.mnt")
        first.env["PYTHONPATH"] = next(iter(trees.values()))[0]
        first.cli("init")
        for cs in sizes:
            first.cli(
                "image", "import", f"base{cs}", work / "base.raw", "--format", "raw", "--chunk-size", cs
            )
        for rep in range(args.reps):
            order = list(trees) if rep % 2 == 0 else list(reversed(trees))
            for name in order:
                volume = f"{name}{rep}".replace("@", "-")
                cas = Casfs(
                    work / "store", work / "casfs.mnt", volume=volume, args=extra.get(name.split("@")[0], ())
                )
                cas.env["PYTHONPATH"], image = trees[name]
                cas.cli("volume", "create", cas.volume or "", "--from", image)
                cas.mnt.touch()
                cas.mount()
                try:
                    for test, fig in run_tree(cas, tests, size, args.runtime, args.warm).items():
                        samples.setdefault(test, {}).setdefault(name, []).append(fig)
                        print(f"  {rep} {name:6} {test:16} {_cell(test, fig)}", file=sys.stderr)
                finally:
                    cas.umount()
                    cas.cli("volume", "rm", cas.volume or "")
    report: dict[str, Any] = {
        test: {
            name: {key: statistics.median(f[key] for f in figs) for key in ("iops", "user_us", "sys_us")}
            for name, figs in by_tree.items()
        }
        for test, by_tree in samples.items()
    }
    lines = [f"{'test':16} " + " | ".join(f"{name:>8}" for name in trees)]
    for test, by_tree in report.items():
        lines.append(f"{test:16} " + " | ".join(_cell(test, by_tree[n]) for n in trees))
    heading = (
        f"{args.size} mixed image, casfs clone{' (warm)' if args.warm else ''}, 4 KiB O_DIRECT, fio; "
        f"median of {args.reps} interleaved runs; CPU = the daemon's user+system time per request "
        "(per GiB for the sequential tests, in MB/s: a write's over its wall time); "
        f"load {os.getloadavg()[0]:.1f} at the end"
    )
    emit(
        {
            "trees": {n: t[0] for n, t in trees.items()},
            "chunk_sizes": sizes,
            "results": report,
            "samples": samples,
        },
        args.json,
        heading,
        "\n".join(lines),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
