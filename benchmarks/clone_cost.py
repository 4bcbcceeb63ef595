#!/usr/bin/env python3
"""Does cloning or snapshotting cost more for a bigger disk? (It must not.)

    python benchmarks/clone_cost.py [--sizes 1M,1G,10G] [--runs 20] [--workdir DIR] [--json]

For each size, imports a sparse raw image with one random 64 KiB chunk every 16 MiB
(so a large image has a real two-level chunk map, not just holes), then times, median
of --runs: create_volume(--from IMAGE) and create_snapshot of a volume made from it.
Each is one catalog transaction (its fsync included); the ratio large/small should
stay near 1.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import arguments, scratch

from casfs.images import import_image
from casfs.repo import Repository
from casfs.units import format_size, parse_size
from casfs.volumes import Source, create_snapshot, create_volume

CHUNK = 64 << 10
STRIDE = 16 << 20


def sparse_image(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)
        for off in range(0, size, STRIDE):
            f.seek(off)
            f.write(os.urandom(min(CHUNK, size - off)))


def run(sizes: list[int], runs: int, work: Path) -> list[dict[str, Any]]:
    """Import every size first, then time the operations interleaved across sizes, so
    that drift (WAL checkpoints, the disk's cache) weighs on every size alike."""
    repo = Repository.init(work / "store")
    try:
        imported: dict[int, float] = {}
        for size in sizes:
            path = work / f"img{size}.raw"
            sparse_image(path, size)
            t = time.perf_counter()
            import_image(repo, f"img{size}", path)
            imported[size] = time.perf_counter() - t
            path.unlink()
            create_volume(repo, f"img{size}-base", Source(image=f"img{size}"))
        clone: dict[int, list[float]] = {s: [] for s in sizes}
        snap: dict[int, list[float]] = {s: [] for s in sizes}
        for i in range(runs):
            for size in sizes:
                t = time.perf_counter()
                create_volume(repo, f"img{size}-v{i}", Source(image=f"img{size}"))
                clone[size].append(time.perf_counter() - t)
                t = time.perf_counter()
                create_snapshot(repo, f"img{size}-base")
                snap[size].append(time.perf_counter() - t)
    finally:
        repo.close()
    out = [
        {
            "size": s,
            "import_s": imported[s],
            "clone_ms": statistics.median(clone[s]) * 1000,
            "snapshot_ms": statistics.median(snap[s]) * 1000,
        }
        for s in sizes
    ]
    for r in out:
        r["clone_vs_smallest"] = r["clone_ms"] / out[0]["clone_ms"]
        r["snapshot_vs_smallest"] = r["snapshot_ms"] / out[0]["snapshot_ms"]
    return out


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--sizes", default="1M,1G,10G", help="comma-separated sizes (default 1M,1G,10G)")
    ap.add_argument("--runs", type=int, default=20, help="timed repetitions per operation (default 20)")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    with scratch(args.workdir, "casfs-bench-", mounts=()) as work:
        results = run(sizes, args.runs, work)

    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"median of {args.runs} runs; ratios are to the smallest image")
    print(f"{'size':>10} {'import s':>9} {'clone ms':>9} {'ratio':>6} {'snapshot ms':>12} {'ratio':>6}")
    for r in results:
        print(
            f"{format_size(r['size']):>10} {r['import_s']:>9.2f} {r['clone_ms']:>9.2f} "
            f"{r['clone_vs_smallest']:>5.2f}x {r['snapshot_ms']:>12.2f} {r['snapshot_vs_smallest']:>5.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
