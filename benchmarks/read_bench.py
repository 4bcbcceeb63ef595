#!/usr/bin/env python3
"""How fast does a block image read through a casfs mount, next to the same file on
the native filesystem and through bindfs (a C FUSE passthrough), in the same run?

    python benchmarks/read_bench.py [--size 1G] [--chunk-size 64K] [--cache-mb N]
                                    [--workdir DIR] [--runtime 15] [--json]

One generated image (half random, three eighths text, one eighth zeros, in 1 MiB runs,
every run distinct) is written to DIR, imported into a fresh store there, and read
with fio through three paths: DIR/native/disk.img, a bindfs mount of DIR/native, and
images/disk of a casfs mount of the store. Tests, in order:

  seq cold     1 MiB buffered sequential reads of the whole file, after dropping the
               page cache and (casfs) remounting, so its chunk cache is empty too
  seq warm     the same again at once: what the kernel's page cache keeps
  rand qd1     4 KiB O_DIRECT random reads, one at a time (psync), --runtime seconds
  rand qd16    the same with 16 in flight (libaio)

The random tests run on a warm store (its blob files in the page cache, as after the
sequential passes): O_DIRECT bypasses the page cache of the file being read, not that
of the files under it. --cache-mb sets the daemon's chunk cache (CASFS_CHUNK_CACHE_MB;
default the daemon's own). Run as root (drop_caches, mounts).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import (
    NOT_DROPPED,
    PEERS,
    Casfs,
    arguments,
    bindfs,
    describe,
    drop_caches,
    emit,
    fio_rows,
    generate,
    is_mounted,
    scratch,
    table,
)
from benchlib import fio as fio_job

_RAND = ["--rw=randread", "--bs=4k", "--direct=1", "--time_based"]
TESTS = {
    "seq cold": ["--rw=read", "--bs=1M", "--ioengine=psync"],
    # fio drops a file's page cache before it starts unless told not to
    "seq warm": ["--rw=read", "--bs=1M", "--ioengine=psync", "--invalidate=0"],
    "rand qd1": [*_RAND, "--ioengine=psync", "--iodepth=1"],
    "rand qd16": [*_RAND, "--ioengine=libaio", "--iodepth=16"],
}


def fio(path: Path, test: str, size: int, runtime: int) -> dict[str, float]:
    args = ["--readonly", *TESTS[test]]
    if "--time_based" in args:
        args += [f"--runtime={runtime}", "--randrepeat=0"]
    return fio_job(path, args, size, timeout=runtime + 600)


def run(size: int, workdir: Path, runtime: int, chunk_size: int, cache_mb: int | None) -> dict[str, Any]:
    from casfs.images import import_image
    from casfs.repo import Repository

    native_dir = workdir / "native"
    native_dir.mkdir()
    image = native_dir / "disk.img"
    generate(image, size, seed=7, runs="zrrrrttt")
    repo = Repository.init(workdir / "store")
    t = time.perf_counter()
    import_image(repo, "disk", image, chunk_size=chunk_size)
    import_s = time.perf_counter() - t
    repo.close()
    results: dict[str, dict[str, dict[str, float]]] = {test: {} for test in TESTS}
    cas = Casfs(workdir / "store", workdir / "casfs", cache_mb=cache_mb)
    cas.mnt.mkdir()
    dropped = True
    with bindfs(native_dir, workdir / "bindfs", read_only=True) as bind:
        paths = {"native": image, "bindfs": bind / "disk.img", "casfs": cas.mnt / "images" / "disk"}
        try:
            for peer in PEERS:
                for test in TESTS:
                    if test == "seq cold":
                        cas.umount()
                        dropped = drop_caches() and dropped
                        if peer == "casfs":
                            cas.mount()
                    elif peer == "casfs" and not is_mounted(cas.mnt):
                        cas.mount()
                    results[test][peer] = fio(paths[peer], test, size, runtime)
                    print(f"  {peer:7} {test:10} {describe(test, results[test][peer])}", file=sys.stderr)
        finally:
            cas.umount()
    return {
        "size": size,
        "chunk_size": chunk_size,
        "cache_mb": cache_mb,
        "import_s": import_s,
        "dropped_caches": dropped,
        "runtime_s": runtime,
        "results": results,
    }


def main() -> int:
    from casfs.units import parse_size

    p = arguments(__doc__)
    p.add_argument("--size", default="1G")
    p.add_argument("--runtime", type=int, default=15, help="seconds per random-read test")
    p.add_argument("--chunk-size", default="64K", help="the image's chunk size (default 64K)")
    p.add_argument("--cache-mb", type=int, default=None, help="the casfs daemon's chunk cache, MiB")
    args = p.parse_args()
    size = parse_size(args.size)
    with scratch(args.workdir, "casfs-readbench-") as work:
        report = run(size, work, args.runtime, parse_size(args.chunk_size), args.cache_mb)
    cache = f"{args.cache_mb} MiB" if args.cache_mb is not None else "default"
    heading = (
        f"{args.size} image, {args.chunk_size} chunks, chunk cache {cache}, {os.cpu_count()} CPUs, fio; "
        "casfs through images/disk of a store mount"
    )
    notes = [] if report["dropped_caches"] else [NOT_DROPPED]
    emit(report, args.json, heading, table(fio_rows(report["results"])), *notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
