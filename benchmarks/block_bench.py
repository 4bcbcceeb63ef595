#!/usr/bin/env python3
"""A read/write block volume under fio, beside the same file on the native filesystem
and through bindfs (a C FUSE passthrough), in one run.

    python benchmarks/block_bench.py [--size 1G] [--runtime 8] [--qd-engine libaio|psync]
                                     [--cache-mb N] [--workdir DIR] [--json]

Three paths to one workload: DIR/native/disk.img, DIR/bindfs/disk.img (bindfs over
DIR/native) and a blank block volume of --size mounted on a file with
`casfs mount FILE --volume disk` (the hypervisor's view). Each peer runs every test in
order, so the reads read what its own sequential write wrote:

  seq write+fsync  1 MiB writes of the whole file, then fsync (--end_fsync=1); MB/s
                   over the wall time, fsync included
  seq read cold    1 MiB buffered reads of the whole file after dropping the page cache;
                   casfs is also remounted (its chunk cache empty, the write folded)
  seq read warm    the same again at once (fio --invalidate=0)
  rand read qd1    4 KiB O_DIRECT random reads, one at a time (psync)
  rand read qd16   the same, 16 in flight: libaio iodepth=16 (--qd-engine libaio, the
                   default: what qemu's aio=native does) or 16 psync jobs (psync)
  rand write qd1   4 KiB O_DIRECT random writes, one at a time (psync)
  rand write qd16  the same, 16 in flight

Write buffers are refilled for every write, half compressible (fio
--refill_buffers --buffer_compress_percentage=50), so casfs cannot dedup fio's repeated
buffer. casfs's O_DIRECT writes are acknowledged from its write-back buffers (as the
native file's are from the disk's cache): durability is what fsync/fdatasync buys, and
the seq write test pays for one. The daemon's peak resident memory (VmHWM) is read from
/proc after every test. Run as root (drop_caches, mounts).
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
    fio,
    fio_rows,
    memory_kib,
    scratch,
    table,
)

MIB = 1 << 20
_DATA = ["--refill_buffers", "--buffer_compress_percentage=50", "--buffer_compress_chunk=4096"]
_RAND = ["--bs=4k", "--direct=1", "--time_based", "--randrepeat=0"]
_PSYNC16 = ["--ioengine=psync", "--numjobs=16", "--group_reporting"]


def tests(qd_engine: str) -> dict[str, list[str]]:
    qd16 = ["--ioengine=libaio", "--iodepth=16"] if qd_engine == "libaio" else _PSYNC16
    return {
        "seq write+fsync": ["--rw=write", "--bs=1M", "--ioengine=psync", "--end_fsync=1", *_DATA],
        "seq read cold": ["--rw=read", "--bs=1M", "--ioengine=psync"],
        "seq read warm": ["--rw=read", "--bs=1M", "--ioengine=psync", "--invalidate=0"],
        "rand read qd1": ["--rw=randread", *_RAND, "--ioengine=psync"],
        "rand read qd16": ["--rw=randread", *_RAND, *qd16],
        "rand write qd1": ["--rw=randwrite", *_RAND, "--ioengine=psync", *_DATA],
        "rand write qd16": ["--rw=randwrite", *_RAND, *qd16, *_DATA],
    }


def run(size: int, work: Path, runtime: int, qd_engine: str, cache_mb: int | None) -> dict[str, Any]:
    native_dir = work / "native"
    native_dir.mkdir()
    cas = Casfs(work / "store", work / "casfs.img", volume="disk", cache_mb=cache_mb)
    cas.cli("init")
    cas.cli("volume", "create", "disk", "--blank-block", str(size))
    cas.mnt.touch()
    plan = tests(qd_engine)
    results: dict[str, dict[str, dict[str, float]]] = {t: {} for t in plan}
    memory: dict[str, dict[str, int]] = {}
    dropped = True
    extra: dict[str, float] = {}
    with bindfs(native_dir, work / "bindfs") as bind:
        paths = {"native": native_dir / "disk.img", "bindfs": bind / "disk.img", "casfs": cas.mnt}
        try:
            for peer in PEERS:
                if peer == "casfs":
                    cas.mount()
                for test, args in plan.items():
                    if test == "seq read cold":
                        if peer == "casfs":
                            t = time.perf_counter()
                            cas.umount()
                            extra["umount after seq write s"] = time.perf_counter() - t
                        dropped = drop_caches() and dropped
                        if peer == "casfs":
                            cas.mount()
                    runtime_args = [f"--runtime={runtime}"] if "--time_based" in args else []
                    t = time.perf_counter()
                    got = fio(paths[peer], [*args, *runtime_args], size)
                    wall = time.perf_counter() - t
                    if test.startswith("seq write"):
                        got["mbps"] = size / wall / 1e6  # the fsync included
                    results[test][peer] = got
                    if peer == "casfs":
                        memory[test] = memory_kib(cas.pid())
                    print(f"  {peer:7} {test:16} {describe(test, got)}", file=sys.stderr)
                if peer == "casfs":
                    t = time.perf_counter()
                    cas.umount()
                    extra["umount after rand writes s"] = time.perf_counter() - t
        finally:
            cas.umount()
    return {
        "size": size,
        "runtime_s": runtime,
        "qd_engine": qd_engine,
        "cache_mb": cache_mb,
        "dropped_caches": dropped,
        "results": results,
        "casfs_memory_kib": memory,
        "casfs_peak_rss_mib": max((m.get("VmHWM", 0) for m in memory.values()), default=0) / 1024,
        "casfs_extra": extra,
    }


def report_table(report: dict[str, Any]) -> str:
    out = [table(fio_rows(report["results"]))]
    out.append(f"casfs daemon peak RSS (VmHWM): {report['casfs_peak_rss_mib']:.0f} MiB")
    for key, value in report["casfs_extra"].items():
        out.append(f"casfs {key}: {value:.2f}")
    if not report["dropped_caches"]:
        out.append(NOT_DROPPED)
    return "\n".join(out)


def main() -> int:
    from casfs.units import parse_size

    p = arguments(__doc__)
    p.add_argument("--size", default="1G")
    p.add_argument("--runtime", type=int, default=8, help="seconds per random test")
    p.add_argument("--qd-engine", choices=("libaio", "psync"), default="libaio", help="how qd16 is made")
    p.add_argument("--cache-mb", type=int, default=None, help="the casfs daemon's chunk cache, MiB")
    args = p.parse_args()
    size = parse_size(args.size)
    with scratch(args.workdir, "casfs-blockbench-", mounts=("casfs.img", "bindfs")) as work:
        report = run(size, work, args.runtime, args.qd_engine, args.cache_mb)
    heading = (
        f"{args.size} block volume, fio, {os.cpu_count()} CPUs, qd16 by {args.qd_engine}"
        f"{' (iodepth=16)' if args.qd_engine == 'libaio' else ' (numjobs=16)'}; casfs mounted on a file"
    )
    emit(report, args.json, heading, report_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
