#!/usr/bin/env python3
"""How fast does `casfs image import` take in a raw disk image, next to `cp`, or a tree, next to restic?

    python benchmarks/import_speed.py [IMAGE] [--size 1G] [--workdir DIR] [--json]
    python benchmarks/import_speed.py --tree DIR [--trees NAME=CHECKOUT ...] [--reps 3]

Without IMAGE, generates a mixed image: a third zeros, a third random, a third text,
interleaved in 1 MiB runs (every run distinct, so dedup finds nothing but holes).
The copy and the store go to DIR (default /var/tmp, not a tmpfs /tmp), one filesystem.
Before each timed step the page cache is dropped (when root), so every step reads the
source from disk. Steps:

  cp         cp --reflink=never, then fsync of the copy (casfs's import is durable too)
  import     import_image() into an empty store
  re-import  the same file under a second name: reads and hashes it all, stores nothing

With --tree (image_bench's tree import, alone and with CPU): DIR is copied under the
work directory (cp -a); then each repetition, in an order that rotates, runs `restic
backup` into a fresh repository (image_bench's flags) and `casfs image import` into a
fresh store, once per --trees checkout (PYTHONPATH=CHECKOUT; default: this one), the
page cache dropped before each. Median wall and CPU (user + system of the command)
seconds, and speed over restic's. CPU moves far less than wall with the machine's load.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import CLI, arguments, drop_caches, emit, generate, scratch, sh

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


def cpu_timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of a command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, check=True, capture_output=True, timeout=1800)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def import_tree(peer: str, checkout: str | None, tree: Path, work: Path) -> tuple[float, float]:
    """One peer's import of `tree` into a fresh repository, caches dropped first."""
    base = work / "repo"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    env = dict(os.environ, RESTIC_PASSWORD="bench", RESTIC_CACHE_DIR=str(base / "restic-cache"))
    if checkout is None:
        sh("restic", "init", "--repo", base / "restic", env=env)
        argv = ["restic", "backup", "--json", "--repo", str(base / "restic"), str(tree)]
    else:
        env.update(PYTHONPATH=checkout, CASFS_STORE=str(base / "store"))
        sh(*CLI, "init", env=env)
        argv = [*CLI, "image", "import", "tree", str(tree)]
    drop_caches()
    try:
        return cpu_timed(argv, env, work)  # (cwd: not a checkout, whose casfs would come first)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_tree(source: Path, checkouts: dict[str, str], reps: int, work: Path) -> dict[str, Any]:
    print(f"copying {source} …", file=sys.stderr)
    tree = work / "tree"
    sh("cp", "-a", source, tree, timeout=1800)
    peers: dict[str, str | None] = {"restic": None, **checkouts}
    names = list(peers)
    samples: dict[str, list[tuple[float, float]]] = {p: [] for p in names}
    for rep in range(reps):
        for peer in names[rep % len(names) :] + names[: rep % len(names)]:
            wall, cpu = import_tree(peer, peers[peer], tree, work)
            samples[peer].append((wall, cpu))
            load = os.getloadavg()[0]
            print(f"  rep {rep} {peer:10} {wall:6.2f} s, CPU {cpu:6.2f} s (load {load:.1f})", file=sys.stderr)
    medians = {
        p: {"wall": statistics.median(w for w, _ in v), "cpu": statistics.median(c for _, c in v)}
        for p, v in samples.items()
    }
    return {"tree": str(source), "reps": reps, "cpus": os.cpu_count(), "samples": samples, "medians": medians}


def tree_text(report: dict[str, Any]) -> list[str]:
    medians = report["medians"]
    restic = medians["restic"]["wall"]
    lines = [f"{report['tree']} copy, {report['cpus']} CPUs, median of {report['reps']} interleaved runs"]
    lines.append(f"{'peer':<12} {'wall s':>7} {'CPU s':>7} {'speed/restic':>13}")
    for peer, m in medians.items():
        lines.append(f"{peer:<12} {m['wall']:>7.2f} {m['cpu']:>7.2f} {restic / m['wall']:>12.2f}x")
    return lines


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("image", nargs="?", type=Path, help="a raw image to import (default: generate one)")
    ap.add_argument("--size", default="1G", help="size of the generated image (default 1G)")
    ap.add_argument("--tree", type=Path, help="import a copy of this tree beside restic instead")
    ap.add_argument("--trees", nargs="+", default=[], help="casfs checkouts to compare, NAME=PATH")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions with --tree (default 3)")
    args = ap.parse_args()

    if args.tree is not None:
        here = str(Path(__file__).resolve().parent.parent)
        checkouts = dict(t.split("=", 1) for t in args.trees) or {"casfs": here}
        with scratch(args.workdir, "casfs-bench-", mounts=()) as work:
            report = run_tree(args.tree, checkouts, args.reps, work)
        emit(report, args.json, *tree_text(report))
        return 0
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
