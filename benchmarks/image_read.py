#!/usr/bin/env python3
"""image_bench's "seq read cold" alone, for casfs trees side by side, with the daemon's CPU.

    python benchmarks/image_read.py [--trees main=/work/main,new=.] [--size 1G] [--reps 3]
                                    [--tree DIR] [--chunk-size 64K] [--paths image,clone]
                                    [--squashfuse] [--workdir DIR] [--json]

One store as image_bench's casfs has it: --tree imported first (default none; image_bench
imports /usr/share, whose 58,000 entries make the pack index seven times larger), then
a generated mixed image of --size (image_bench's: zeros, random, text in 1 MiB runs), and
a volume cloned from it. Each repetition, for each tree in turn (the order alternating),
after a drop of the page cache and a fresh mount: `dd bs=1M` of

  image     MNT/images/disk of the whole-store mount (image_bench's path)
  clone     the clone's block volume mounted on a file (block_bench's path)
  pt-first  image, mounted `--ro` with passthrough's file cache emptied (image_bench's
            pt-first: the first reader beside the background fill of the cache file;
            the fill's end is awaited after the dd, untimed, and its status printed)

and with --squashfuse, the same image in a squashfs (mksquashfs -comp zstd, once)
through `squashfuse -f`. Reported: MB/s, and the daemon's CPU seconds per GiB read
(user+system; and its main thread's: casfs's trio thread, which serves every FUSE
request), and the daemon's peak RSS (VmHWM) after the dd, medians. Run as root.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchlib import (
    Casfs,
    arguments,
    cpu_s,
    drop_caches,
    emit,
    generate,
    memory_kib,
    scratch,
    sh,
    stop_on_sigterm,
    unmount,
    wait_file_cache,
)


def cpu(pid: int) -> tuple[float, float]:
    """(all threads', the main thread's) user+system CPU seconds of a process."""
    return sum(cpu_s(pid)), sum(cpu_s(pid, thread=pid))


def timed_dd(path: Path, pid: int, size: int) -> dict[str, float]:
    c0, m0 = cpu(pid)
    t = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    secs = time.perf_counter() - t
    c1, m1 = cpu(pid)
    gib = size / (1 << 30)
    peak = memory_kib(pid).get("VmHWM", 0) / 1024
    return {
        "mbps": size / secs / 1e6,
        "cpu_s_gib": (c1 - c0) / gib,
        "trio_s_gib": (m1 - m0) / gib,
        "peak_mib": peak,
    }


@contextlib.contextmanager
def casfs_path(work: Path, tree: str, path: str) -> Iterator[tuple[Path, int]]:
    """The image's file as `path` serves it with casfs from `tree`, and the daemon's pid."""
    if path in ("image", "pt-first"):
        cas = Casfs(work / "store", work / "casfs", args=("--ro",) if path == "pt-first" else ())
        cas.mnt.mkdir(exist_ok=True)
        target = cas.mnt / "images" / "disk"
        if path == "pt-first":
            sh("rm", "-rf", work / "store" / "cache" / "files")
    else:
        cas = Casfs(work / "store", work / "casfs.file", volume="clone")
        cas.mnt.touch()
        target = cas.mnt
    cas.env["PYTHONPATH"] = tree
    with cas.mounted():
        pid = cas.pid()
        assert pid is not None
        os.stat(target)  # (the lookups, before the clock starts)
        yield target, pid
        if path == "pt-first":
            left = wait_file_cache(cas.mnt)  # (not timed: what the first reader left running)
            print(f"  the fill ended {left:.1f} s after the dd", file=sys.stderr)


@contextlib.contextmanager
def squashfuse_path(work: Path) -> Iterator[tuple[Path, int]]:
    mnt = work / "squashfuse"
    mnt.mkdir(exist_ok=True)
    proc = subprocess.Popen(["squashfuse", "-f", str(work / "disk.sqsh"), str(mnt)])
    try:
        deadline = time.monotonic() + 60
        while not (mnt / "disk.img").exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("squashfuse did not mount")
            time.sleep(0.05)
        yield mnt / "disk.img", proc.pid
    finally:
        unmount(mnt)
        proc.wait()


def main() -> int:
    from casfs.units import parse_size

    p = arguments(__doc__)
    p.add_argument("--trees", default=f"main=/work/main,new={Path(__file__).resolve().parent.parent}")
    p.add_argument("--size", default="1G")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tree", default="", help="a directory to import first (image_bench: /usr/share)")
    p.add_argument("--chunk-size", default="64K")
    p.add_argument("--paths", default="image,clone")
    p.add_argument("--squashfuse", action="store_true")
    args = p.parse_args()
    size = parse_size(args.size)
    trees = dict(item.split("=", 1) for item in args.trees.split(","))
    peers = [f"{name} {path}" for path in args.paths.split(",") for name in trees]
    peers += ["squashfuse"] if args.squashfuse else []
    samples: dict[str, list[dict[str, float]]] = {peer: [] for peer in peers}
    stop_on_sigterm()
    with scratch(args.workdir, "casfs-imageread-", mounts=("casfs", "casfs.file", "squashfuse")) as work:
        raw = work / "disk.img"
        generate(raw, size, seed=1, runs="zrt")
        first = Casfs(work / "store", work / "casfs")
        first.env["PYTHONPATH"] = next(iter(trees.values()))
        first.cli("init")
        if args.tree:
            first.cli("image", "import", "tree", args.tree, timeout=1800)
        first.cli("image", "import", "disk", raw, "--format", "raw", "--chunk-size", args.chunk_size)
        first.cli("volume", "create", "clone", "--from", "disk")
        if args.squashfuse:
            sh("mksquashfs", raw, work / "disk.sqsh", "-comp", "zstd", "-no-progress", timeout=1800)
        raw.unlink()
        for rep in range(args.reps):
            for peer in peers if rep % 2 == 0 else list(reversed(peers)):
                drop_caches()
                if peer == "squashfuse":
                    served = squashfuse_path(work)
                else:
                    name, path = peer.split()
                    served = casfs_path(work, trees[name], path)
                with served as (target, pid):
                    fig = timed_dd(target, pid, size)
                samples[peer].append(fig)
                line = f"  {rep} {peer:14} {fig['mbps']:6.0f} MB/s {fig['cpu_s_gib']:5.2f} s CPU/GiB"
                line += f" (main thread {fig['trio_s_gib']:.2f}), load {os.getloadavg()[0]:.1f}"
                print(line, file=sys.stderr)
    report: dict[str, Any] = {
        peer: {key: statistics.median(f[key] for f in figs) for key in figs[0]}
        for peer, figs in samples.items()
    }
    lines = [f"{'peer':16} {'MB/s':>8} {'CPU s/GiB':>10} {'main thread':>12} {'peak RSS MiB':>13}"]
    for peer, fig in report.items():
        cells = (
            f"{fig['mbps']:8.0f} {fig['cpu_s_gib']:10.2f} {fig['trio_s_gib']:12.2f} {fig['peak_mib']:13.1f}"
        )
        lines.append(f"{peer:16} {cells}")
    heading = f"cold dd bs=1M of a {args.size} mixed image ({args.chunk_size} chunks); median of {args.reps}"
    emit(report, args.json, heading + f", load {os.getloadavg()[0]:.1f} at the end", *lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
