#!/usr/bin/env python3
"""How fast does `casfs image import` take in a raw disk image, next to `cp`?

    python benchmarks/import_speed.py [IMAGE] [--size 1G] [--workdir DIR] [--json]

Without IMAGE, generates a mixed image: a third zeros, a third random, a third text,
interleaved in 1 MiB runs (every run distinct, so dedup finds nothing but holes).
The copy and the store go to DIR (default /var/tmp, not a tmpfs /tmp), one filesystem.
Before each timed step the page cache is dropped (when root), so every step reads the
source from disk. Steps:

  cp         cp --reflink=never, then fsync of the copy (casfs's import is durable too)
  import     import_image() into an empty store
  re-import  the same file under a second name: reads and hashes it all, stores nothing
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import arguments, drop_caches, generate, scratch

from casfs.images import import_image
from casfs.repo import Repository
from casfs.units import format_size, parse_size


def stored_total(repo: Repository) -> int:
    return int(repo.conn.execute("SELECT COALESCE(SUM(stored), 0) FROM blobs").fetchone()[0])


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(image: Path, workdir: Path) -> dict[str, Any]:
    size = image.stat().st_size
    copy = workdir / "copy.img"
    dropped = drop_caches()

    def cp() -> None:
        subprocess.run(["cp", "--reflink=never", str(image), str(copy)], check=True)
        fd = os.open(copy, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    results: list[dict[str, Any]] = []
    t_cp = timed(cp)
    results.append({"step": "cp", "seconds": t_cp, "new_stored": size})
    copy.unlink()

    repo = Repository.init(workdir / "store")
    try:
        for step, name in (("import", "bench"), ("re-import", "bench-again")):
            drop_caches()
            before = stored_total(repo)
            t = timed(lambda name=name: import_image(repo, name, image))
            results.append({"step": step, "seconds": t, "new_stored": stored_total(repo) - before})
    finally:
        repo.close()
    for r in results:
        r["mb_per_s"] = size / r["seconds"] / 1e6
        r["vs_cp"] = t_cp / r["seconds"]  # > 1: faster than cp
    return {
        "image": str(image),
        "size": size,
        "caches_dropped": dropped,
        "cpus": os.cpu_count(),
        "steps": results,
    }


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("image", nargs="?", type=Path, help="a raw image to import (default: generate one)")
    ap.add_argument("--size", default="1G", help="size of the generated image (default 1G)")
    args = ap.parse_args()

    with scratch(args.workdir, "casfs-bench-", mounts=()) as work:
        image = args.image
        if image is None:
            image = work / "mixed.img"
            print(f"generating {args.size} mixed image at {image} …", file=sys.stderr)
            generate(image, parse_size(args.size), seed=1, runs="zrt")
        report = run(image, work)

    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    if not report["caches_dropped"]:
        print("note: page cache not dropped (needs root): reads may come from memory", file=sys.stderr)
    print(f"{report['image']}: {format_size(report['size'])}, {report['cpus']} CPUs")
    print(f"{'step':<10} {'seconds':>8} {'MB/s':>8} {'vs cp':>6} {'stored new':>12}")
    for r in report["steps"]:
        print(
            f"{r['step']:<10} {r['seconds']:>8.2f} {r['mb_per_s']:>8.1f} {r['vs_cp']:>5.2f}x "
            f"{format_size(r['new_stored']):>12}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
