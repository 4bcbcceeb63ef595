#!/usr/bin/env python3
"""Scrub's rate beside fsck and b3sum, on the same bytes.

    python benchmarks/scrub_bench.py [--size 1G] [--reps 3] [--workdir DIR] [--json]

A --size mixed image (image_bench's: zeros, random, text in 1 MiB runs) is imported
into a fresh store; each repetition, after a drop of the page cache: `casfs scrub`
(every blob of the image re-read and re-hashed, holders tracked), `casfs fsck` (every
blob re-hashed and every reference recounted), and `b3sum` of the raw image (BLAKE3 of
the same logical bytes, the zero runs included, with no decompression). MB/s of the
image's logical size; medians. Run as root (it drops the page cache).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from benchlib import Casfs, arguments, drop_caches, emit, generate, scratch, sh, stop_on_sigterm

MIB = 1 << 20


def timed_rate(size: int, *cmd: str | Path) -> float:
    drop_caches()
    t = time.perf_counter()
    sh(*cmd, timeout=3600)
    return size / (time.perf_counter() - t) / 1e6


def main() -> int:
    p = arguments(__doc__)
    p.add_argument("--size", default="1G")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    stop_on_sigterm()
    size = int(args.size[:-1]) << {"M": 20, "G": 30}[args.size[-1]]
    rates: dict[str, list[float]] = {"scrub": [], "fsck": [], "b3sum": []}
    with scratch(args.workdir, "casfs-scrub-", mounts=()) as work:
        raw = work / "disk.raw"
        generate(raw, size, seed=1, runs="zrt")
        cas = Casfs(work / "store", work / "mnt")
        cas.cli("init")
        cas.cli("image", "import", "disk", raw)
        cli = [sys.executable, "-m", "casfs", "-s", str(work / "store")]
        for _ in range(args.reps):
            rates["scrub"].append(timed_rate(size, *cli, "scrub"))
            rates["fsck"].append(timed_rate(size, *cli, "fsck"))
            rates["b3sum"].append(timed_rate(size, "b3sum", "--no-names", raw))
    med = {k: statistics.median(v) for k, v in rates.items()}
    lines = [f"{args.size} mixed image, {args.reps} repetitions, MB/s of its logical size (medians)"]
    lines += [f"{k:8} {v:8.0f} MB/s   {v / med['b3sum']:5.2f}x b3sum" for k, v in med.items()]
    emit({"medians": med, "runs": rates}, args.json, *lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
