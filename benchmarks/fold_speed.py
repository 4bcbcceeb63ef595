#!/usr/bin/env python3
"""How fast does a block volume's background fold store what was written, without a mount?

    python benchmarks/fold_speed.py [--size 1G] [--kind r] [--reps 1] [--chunk-size 64K]
                                    [--workdir DIR] [--json]

In-process, so its figures are casfs's store path alone (no FUSE, no fio): a fresh
store, a volume cloned from an image of --size zeros, --size written through the view
in 1 MiB writes (--kind, cycled per MiB: r random, z zeros, t text), synced and frozen
as a snapshot; then the fold that store_bench.py and block_bench.py time in the daemon
runs here, timed. Reported: MB/s of the size written, the fold's CPU (user, sys), and
the bytes its blobs take. Interleave runs of two checkouts by PYTHONPATH to compare.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import MIB, arguments, scratch

from casfs import images, volumes
from casfs.ids import ROOT_INO
from casfs.repo import Repository
from casfs.units import parse_size
from casfs.vfs.rw.volume import finish
from casfs.vfs.volume import open_volume
from tests.helpers.volumes import block, freeze_of


def payload(kind: str, i: int, rnd: random.Random, text: bytes) -> bytes:
    if kind == "r":
        return rnd.randbytes(MIB)
    if kind == "z":
        return bytes(MIB)
    return text[i % 7 :][:MIB].ljust(MIB, b".")


def run(work: Path, size: int, kinds: str, chunk_size: int) -> dict[str, Any]:
    shutil.rmtree(work / "store", ignore_errors=True)
    repo = Repository.init(work / "store")
    try:
        image = work / "zero.img"
        with open(image, "wb") as f:
            f.truncate(size)
        images.import_image(repo, "disk", image, chunk_size=chunk_size)
        volumes.create_volume(repo, "v", volumes.Source(image="disk"))
        view = open_volume(repo, "v")
        block(view)
        view.ensure_writable()
        rnd = random.Random(1)
        words = [bytes(rnd.choices(b"abcdefghijklmnopqrstuvwxyz", k=rnd.randint(2, 10))) for _ in range(5000)]
        text = b" ".join(rnd.choices(words, k=MIB // 3))
        for i in range(size // MIB):
            view.write_sync(ROOT_INO, i * MIB, payload(kinds[i % len(kinds)], i, rnd, text))
        view.flush_sync()
        freeze = freeze_of(view, "folded")
        assert freeze is not None
        finish(freeze)
        fold = view.prepare_background_fold()
        assert fold is not None
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        finish(fold)
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        stored = repo.conn.execute("SELECT COALESCE(SUM(stored), 0) FROM blobs").fetchone()[0]
        view.close(snapshot=False)
    finally:
        repo.close()
    return {
        "seconds": seconds,
        "mb_per_s": size / seconds / 1e6,
        "user_s": after.ru_utime - before.ru_utime,
        "sys_s": after.ru_stime - before.ru_stime,
        "stored": int(stored),
        "load": os.getloadavg()[0],
    }


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--size", default="1G", help="bytes written and folded (whole MiB)")
    ap.add_argument("--kind", default="r", help="per MiB, cycled: r random, z zeros, t text")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--chunk-size", default="64K", help="the volume's chunk size (its image's)")
    args = ap.parse_args()
    size = parse_size(args.size) // MIB * MIB
    chunk_size = parse_size(args.chunk_size)
    with scratch(args.workdir, "casfs-fold-", mounts=()) as work:
        results = [run(work, size, args.kind, chunk_size) for _ in range(args.reps)]
    if args.json:
        print(
            json.dumps({"size": size, "kind": args.kind, "chunk_size": chunk_size, "runs": results}, indent=2)
        )
        return 0
    for r in results:
        print(
            f"fold of {size // MIB} MiB ({args.kind}, {args.chunk_size} chunks): "
            f"{r['mb_per_s']:.0f} MB/s ({r['seconds']:.2f} s), "
            f"CPU {r['user_s']:.2f} user + {r['sys_s']:.2f} sys, stored {r['stored'] / 1e6:.0f} MB, "
            f"load {r['load']:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
