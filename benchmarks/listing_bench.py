#!/usr/bin/env python3
"""Do listings and `info` cost what they list, whatever the volumes' sizes? (They must.)

    python benchmarks/listing_bench.py [--counts 10,1000,10000] [--sizes 1G,64G,1T]
                                       [--runs 5] [--trees OLD_TREE] [--workdir DIR] [--json]

Listings: a store with one 64 MiB block image (random and zero runs) and COUNT clones of
it, made through the library; median of --runs of the CLI `casfs volume ls` and `casfs
volume ls --json` (a Python process start included), beside `ls -l` of a directory of
COUNT files; ratios casfs / ls.

Info: a volume cloned from a disk image of each size whose every 32 KiB chunk is one of
97 stored ones (a map of size/32 KiB entries: 32 million for 1 TiB, its pages 1 GiB;
built through the ledger, as an importer does, since reading 1 TiB would take hours),
then `casfs volume info VOL` (median of --runs) and, in one process, the library call behind it
(refcount.accounts.volume_figures, what the CSI plugin calls; an older tree's
usage.volume_usage), beside `qemu-img info` of a qcow2 of the same size with 16 chunks
written (`qemu-io`); ratios casfs / qemu-img.

--trees OLD_TREE times the same listings and infos with another casfs source tree
(e.g. `git archive b63f815 casfs | tar -x -C /tmp/old`) on its own store, before/after.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import arguments, emit, scratch

from casfs.units import format_size, parse_size

MIB = 1 << 20
CHUNK = 32 << 10
WRITES = 16
LISTING_SIZE = 64 * MIB


def _cli(tree: Path | None, store: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "casfs", "-s", str(store), *args]


def _env(tree: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def median_run_ms(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd="/", timeout=600)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


BUILD_LISTING = """
import os, random, sys
from pathlib import Path
from casfs import images, volumes
from casfs.repo import Repository
store, count, size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
repo = Repository.open(store) if (store / "catalog.db").exists() else Repository.init(store)
try:
    have = {v.name for v in volumes.list_volumes(repo)}
    if not any(i.name == "disk" for i in images.list_images(repo)):
        rnd = random.Random(1)
        raw = store.parent / "disk.raw"
        with open(raw, "wb") as f:
            for i in range(size >> 20):
                f.write(rnd.randbytes(1 << 20) if i % 2 else bytes(1 << 20))
        images.import_image(repo, "disk", raw)
        raw.unlink()
    for i in range(count):
        if f"v{i:05d}" not in have:
            volumes.create_volume(repo, f"v{i:05d}", volumes.Source(image="disk"))
finally:
    repo.close()
"""

BUILD_DISK = """
import random, sys
from casfs import volumes
from casfs.kinds import BlobKind
from casfs.repo import Repository
from casfs.snapshots import chunkmap
store, name, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
CH = 32768
count = size // CH
rnd = random.Random(size)
repo = Repository.open(store)
try:
    with repo.batch() as b:
        pool = [b.put(rnd.randbytes(CH)) for _ in range(97)]
        pages = []
        for start in range(0, count, chunkmap.PAGE_ENTRIES):
            ids = rnd.choices(pool, k=min(chunkmap.PAGE_ENTRIES, count - start))
            pages.append(b.put(chunkmap.encode_page(ids), BlobKind.MAP_PAGE))
        root = b.put(chunkmap.MapRoot(1, CH, size, pages).encode(), BlobKind.MAP_ROOT)
        row = (
            "INSERT INTO images (name, kind, phase, root, size, chunk_size, created) "
            "VALUES (?, 'block', 'ready', ?, ?, ?, 0)"
        )
        b.commit({root: 1}, then=lambda c: c.execute(row, (name, root, size, CH)))
    try:  # (an import counts its image's figures; an older tree keeps none)
        from casfs.refcount.accounts import settle
        settle(repo, [f"image:{name}"], None)
    except ImportError:
        pass
    volumes.create_volume(repo, f"vol-{name}", volumes.Source(image=name))
finally:
    repo.close()
"""


# In-process: what the CSI plugin's NodeGetVolumeStats pays (no process start).
TIME_CALL = """
import statistics, sys, time
from casfs.repo import Repository
repo = Repository.open(sys.argv[1])
try:
    from casfs.refcount.accounts import volume_figures
    call = lambda: volume_figures(repo, sys.argv[2])
except ImportError:  # (an older tree: the walk it had)
    from casfs.refcount.usage import volume_usage
    call = lambda: volume_usage(repo, sys.argv[2])
times = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter()
    call()
    times.append((time.perf_counter() - t) * 1000)
print(statistics.median(times))
repo.close()
"""


def listings(work: Path, counts: list[int], runs: int, tree: Path | None) -> list[dict[str, Any]]:
    store = work / "list-store"
    env = _env(tree)
    out = []
    for count in sorted(counts):
        t = time.perf_counter()
        build = [sys.executable, "-c", BUILD_LISTING, str(store), str(count), str(LISTING_SIZE)]
        subprocess.run(build, check=True, env=env, cwd="/", timeout=3600)
        made_s = time.perf_counter() - t
        files = work / f"files-{count}"
        files.mkdir()
        for i in range(count):
            (files / f"v{i:05d}").write_bytes(b"")
        ls_ms = median_run_ms(["ls", "-l", str(files)], runs)
        shutil.rmtree(files)
        table_ms = median_run_ms(_cli(tree, store, "volume", "ls"), runs, env)
        json_ms = median_run_ms(_cli(tree, store, "volume", "ls", "--json"), runs, env)
        out.append(
            {
                "volumes": count,
                "made_s": made_s,
                "ls_ms": table_ms,
                "ls_json_ms": json_ms,
                "ls_l_ms": ls_ms,
                "ms_per_volume": table_ms / count,
            }
        )
    return out


def infos(work: Path, sizes: list[int], runs: int, tree: Path | None) -> list[dict[str, Any]]:
    store = work / "info-store"
    env = _env(tree)
    subprocess.run(_cli(tree, store, "init"), check=True, env=env, cwd="/", stdout=subprocess.DEVNULL)
    out = []
    for size in sizes:
        name = f"d{size >> 30}g"
        build = [sys.executable, "-c", BUILD_DISK, str(store), name, str(size)]
        subprocess.run(build, check=True, env=env, cwd="/", timeout=3600)
        name = f"vol-{name}"
        qcow = work / f"{name}.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(qcow), str(size)], check=True)
        io = [arg for k in range(WRITES) for arg in ("-c", f"write -P {k + 1} {k * (size // WRITES)} 32k")]
        subprocess.run(["qemu-io", "-f", "qcow2", *io, str(qcow)], check=True, stdout=subprocess.DEVNULL)
        qemu_ms = median_run_ms(["qemu-img", "info", str(qcow)], runs)
        info_ms = median_run_ms(_cli(tree, store, "volume", "info", name), runs, env)
        call = [sys.executable, "-c", TIME_CALL, str(store), name, str(10 * runs)]
        timed = subprocess.run(call, check=True, env=env, cwd="/", capture_output=True, text=True)
        call_ms = float(timed.stdout)
        qcow.unlink()
        out.append(
            {
                "size": size,
                "info_ms": info_ms,
                "library_ms": call_ms,
                "qemu_img_info_ms": qemu_ms,
                "ratio": info_ms / qemu_ms,
                "library_ratio": call_ms / qemu_ms,
            }
        )
    return out


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--counts", default="10,1000,10000", help="volumes to list (default 10,1000,10000)")
    ap.add_argument("--sizes", default="1G,64G,1T", help="volume sizes for info (default 1G,64G,1T)")
    ap.add_argument("--runs", type=int, default=5, help="timed repetitions (default 5)")
    ap.add_argument("--trees", metavar="OLD_TREE", help="also time another casfs source tree")
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    trees: list[tuple[str, Path | None]] = [("this", None)]
    if args.trees:
        trees.append(("other", Path(args.trees)))
    report: dict[str, Any] = {}
    for label, tree in trees:
        with scratch(args.workdir, "casfs-listing-", mounts=()) as work:
            report[label] = {
                "listings": listings(work, counts, args.runs, tree),
                "infos": infos(work, sizes, args.runs, tree),
            }
    lines = [f"median of {args.runs} runs, ms (a CLI process start included)"]
    for label, r in report.items():
        lines.append(f"\n[{label} tree]")
        lines.append(
            f"{'volumes':>8} {'ls':>9} {'ls --json':>10} {'ls -l':>8} {'ls/ls -l':>9} {'ms/volume':>10}"
        )
        for x in r["listings"]:
            lines.append(
                f"{x['volumes']:>8} {x['ls_ms']:>9.1f} {x['ls_json_ms']:>10.1f} {x['ls_l_ms']:>8.1f} "
                f"{x['ls_ms'] / x['ls_l_ms']:>8.1f}x {x['ms_per_volume']:>10.3f}"
            )
        head = f"{'size':>8} {'info':>9} {'qemu-img info':>14} {'ratio':>7} {'library':>8} {'ratio':>7}"
        lines.append(head)
        for x in r["infos"]:
            size, ms, qemu = format_size(x["size"]), x["info_ms"], x["qemu_img_info_ms"]
            lib = f"{x['library_ms']:>8.2f} {x['library_ratio']:>6.2f}x"
            lines.append(f"{size:>8} {ms:>9.1f} {qemu:>14.1f} {x['ratio']:>6.2f}x {lib}")
    emit(report, args.json, *lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
