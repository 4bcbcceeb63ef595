#!/usr/bin/env python3
"""A block volume's snapshot while mounted in a whole-store mount (`casfs mount MNT`,
volumes/NAME under the kernel's writeback cache), after N written: it should be a
freeze, flat in N (issue 8), like block_bench.py's "snapshot, N written" on a mount of
the volume's own file.

    python benchmarks/wholestore_snapshot.py [--sizes 1M,1G] [--snaps 3] [--reps 2]
                                             [--trees DIR,DIR] [--workdir DIR] [--json]

For each repetition, tree (--trees: source trees compared interleaved, the daemon and
CLI run from each with PYTHONPATH; default this one) and size N: a fresh store, a blank
block volume as big as the largest N, the store mounted; then --snaps times: N random
bytes written from offset 0 (block_bench.write_random: 1 MiB O_DIRECT writes, one
fdatasync), `setfattr -n user.casfs.snapshot` timed, and its fold waited for (untimed).
Figures: ms of the first snapshot and of the later ones (median over them and the
repetitions). The kernel writes the file's times back after each setxattr; where that
makes the next snapshot a fold, the later ones grow with N. Run as root (mounts).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from pathlib import Path

from benchlib import MIB, Casfs, arguments, emit, is_mounted, scratch
from block_bench import CasfsDisk, write_random

from casfs.units import parse_size


def one_run(tree: Path | None, work: Path, mnt: Path, size: int, n: int, snaps: int) -> list[float]:
    """Ms of each of `snaps` snapshots, each after n bytes written."""
    cas = Casfs(work / "store", mnt)
    if tree is not None:
        cas.env["PYTHONPATH"] = str(tree)
    cas.mnt.mkdir(exist_ok=True)
    assert not is_mounted(mnt), f"{mnt} is still mounted by an earlier run"
    cas.cli("init")
    cas.cli("volume", "create", "v", "--blank-block", str(size))
    disk = CasfsDisk(Casfs(cas.store, cas.mnt, volume="v"))  # (its snapshot and wait_folded)
    disk.path = cas.mnt / "volumes" / "v"
    times = []
    with cas.mounted():
        for i in range(snaps):
            write_random(disk.path, n)
            start = time.perf_counter()
            disk.snapshot(f"s{i}")
            times.append((time.perf_counter() - start) * 1000)
            disk.wait_folded()
    return times


def main() -> int:
    p = arguments(__doc__)
    p.add_argument("--sizes", default="1M,1G", help="amounts written before each snapshot (whole MiB)")
    p.add_argument("--snaps", type=int, default=3)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--trees", default="", help="source trees to compare (comma-separated)")
    args = p.parse_args()
    sizes = {s: parse_size(s) // MIB * MIB for s in args.sizes.split(",")}
    trees: list[Path | None] = [Path(t).resolve() for t in args.trees.split(",") if t] or [None]
    disk_size = max(sizes.values())
    found: dict[str, dict[str, list[float]]] = {}
    with scratch(args.workdir, "wholestore-snap-", mounts=("casfs",)) as work:
        mnt = work / "casfs"  # (one mount at a time, where scratch() unmounts it if a run fails)
        for rep in range(args.reps):
            for tree in trees[rep % len(trees) :] + trees[: rep % len(trees)]:
                for label, n in sizes.items():
                    run_dir = work / f"r{rep}-{len(found)}-{label}"
                    run_dir.mkdir()
                    times = one_run(tree, run_dir, mnt, disk_size, n, args.snaps)
                    name = str(tree or "this tree")
                    by = found.setdefault(name, {})
                    by.setdefault(f"first, {label} written", []).append(times[0])
                    by.setdefault(f"later, {label} written", []).extend(times[1:])
                    print(f"{name} {label}: {[round(t, 1) for t in times]} ms", file=sys.stderr)
                    if not is_mounted(mnt):  # (never delete a store a daemon still serves)
                        shutil.rmtree(run_dir)
    report = {t: {k: statistics.median(v) for k, v in by.items()} for t, by in found.items()}
    lines = ["snapshot in a whole-store mount, ms (median)"]
    for t, figures in report.items():
        lines.append(t)
        lines += [f"  {k:<22} {v:9.1f}" for k, v in figures.items()]
    emit(report, args.json, *lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
