#!/usr/bin/env python3
"""A clone of a disk image under a hypervisor's I/O: casfs beside qemu-storage-daemon's
FUSE export of a qcow2 overlay and of a raw copy, and the native file, in one run.

    python benchmarks/block_bench.py [--size 1G] [--runtime 5] [--reps 3]
                                     [--cache-mb N] [--workdir DIR] [--json]

One base image (a third zeros, a third random, a third text: benchmarks/import_speed.py's
generator) is presented four ways, each made fresh for every repetition:

  native     a copy of the image on the work directory's filesystem
  qsd-raw    a copy of the image exported by qemu-storage-daemon over FUSE
  qsd-qcow2  a qcow2 overlay on the image (`qemu-img create -b`), exported the same way
  casfs      the image imported once, a volume cloned from it per repetition
             (`casfs volume create --from`), mounted on a file (`casfs mount FILE --volume`)

Every peer runs the same sequence on its fresh disk; the peers' order rotates between
repetitions (interleaved), and each figure is the median over repetitions:

  seq read cold    1 MiB buffered reads of the whole disk (the image's content)
  rand read qd1    4 KiB O_DIRECT random reads, one at a time (psync)
  rand read qd16   the same, 16 in flight (libaio iodepth=16: qemu's aio=native)
  rand write qd1   4 KiB O_DIRECT random writes, one at a time
  rand write qd16  the same, 16 in flight
  seq write+fsync  1 MiB writes of non-zero data over the whole disk, then fsync; MB/s
                   over the wall time, the fsync included
  snapshot         casfs only: setfattr user.casfs.snapshot after the writes, ms

Before each read test the page cache is dropped and every FUSE daemon restarted, so
neither the kernel nor a daemon's own cache holds the data. Write buffers are
refilled for every write and half compressible, so nothing dedups fio's buffer. The
daemons' peak resident memory (VmHWM) is read before each stops. Ratios are casfs over
qsd-qcow2 (the target) and over qsd-raw. Run as root (drop_caches, mounts); the peers
are installed by scripts/install-bench.sh.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from benchlib import Casfs, Row, arguments, drop_caches, emit, fio, generate, memory_kib, scratch, sh, table
from qsd import Qsd, available

PEERS = ("native", "qsd-raw", "qsd-qcow2", "casfs")
_DATA = ["--refill_buffers", "--buffer_compress_percentage=50", "--buffer_compress_chunk=4096"]
_RAND = ["--bs=4k", "--direct=1", "--time_based", "--randrepeat=0"]
_QD1 = ["--ioengine=psync"]
_QD16 = ["--ioengine=libaio", "--iodepth=16"]
TESTS: dict[str, list[str]] = {
    "seq read cold": ["--rw=read", "--bs=1M", "--ioengine=psync"],
    "rand read qd1": ["--rw=randread", *_RAND, *_QD1],
    "rand read qd16": ["--rw=randread", *_RAND, *_QD16],
    "rand write qd1": ["--rw=randwrite", *_RAND, *_QD1, *_DATA],
    "rand write qd16": ["--rw=randwrite", *_RAND, *_QD16, *_DATA],
    "seq write+fsync": ["--rw=write", "--bs=1M", "--ioengine=psync", "--end_fsync=1", *_DATA],
}


class Disk(Protocol):
    path: Path

    def restart(self) -> None: ...
    def pid(self) -> int | None: ...


class NativeDisk:
    def __init__(self, path: Path) -> None:
        self.path = path

    def restart(self) -> None:
        pass

    def pid(self) -> int | None:
        return None


class QsdDisk:
    def __init__(self, qsd: Qsd) -> None:
        self.qsd, self.path = qsd, qsd.mnt

    def restart(self) -> None:
        self.qsd.restart()

    def pid(self) -> int | None:
        return self.qsd.pid


class CasfsDisk:
    def __init__(self, cas: Casfs) -> None:
        self.cas, self.path = cas, cas.mnt

    def restart(self) -> None:
        self.cas.umount()
        self.cas.mount()

    def pid(self) -> int | None:
        return self.cas.pid()


@contextmanager
def fresh_disk(peer: str, work: Path, base: Path, rep: int, cache_mb: int | None) -> Iterator[Disk]:
    """The peer's disk made anew from the base image, mounted; undone afterwards."""
    if peer in ("native", "qsd-raw"):
        copy = work / f"{peer}.img"
        sh("cp", "--sparse=never", base, copy, timeout=600)
        if peer == "native":
            try:
                yield NativeDisk(copy)
            finally:
                copy.unlink(missing_ok=True)
            return
        qsd = Qsd(copy, work / "qsd-raw.mnt", "raw")
    elif peer == "qsd-qcow2":
        qsd = Qsd.overlay(base, work / "overlay.qcow2", work / "qsd-qcow2.mnt")
    else:
        cas = Casfs(work / "store", work / "casfs.mnt", volume=f"clone{rep}", cache_mb=cache_mb)
        cas.cli("volume", "create", f"clone{rep}", "--from", "base")
        cas.mnt.touch()
        cas.mount()
        try:
            yield CasfsDisk(cas)
        finally:
            cas.umount()
            cas.cli("volume", "rm", f"clone{rep}")
        return
    qsd.mount()
    try:
        yield QsdDisk(qsd)
    finally:
        qsd.umount()
        qsd.image.unlink(missing_ok=True)


def run_peer(peer: str, disk: Disk, size: int, runtime: int) -> tuple[dict[str, float], int]:
    """The test sequence on one fresh disk: each test's figure, and the daemon's VmHWM."""
    figures: dict[str, float] = {}
    peak = 0
    for test, args in TESTS.items():
        if "read" in test:
            peak = max(peak, memory_kib(disk.pid()).get("VmHWM", 0))
            disk.restart()
            drop_caches()
        timed_args = [f"--runtime={runtime}"] if "--time_based" in args else []
        t = time.perf_counter()
        got = fio(disk.path, [*args, *timed_args], size)
        wall = time.perf_counter() - t
        figures[test] = size / wall / 1e6 if test.startswith("seq write") else got[_key(test)]
        print(f"  {peer:9} {test:16} {figures[test]:10.1f} {_unit(test)}", file=sys.stderr)
    if isinstance(disk, CasfsDisk):
        t = time.perf_counter()
        subprocess.run(["setfattr", "-n", "user.casfs.snapshot", "-v", "bench", str(disk.path)], check=True)
        figures["snapshot"] = (time.perf_counter() - t) * 1000
    peak = max(peak, memory_kib(disk.pid()).get("VmHWM", 0))
    return figures, peak


def _key(test: str) -> str:
    return "mbps" if test.startswith("seq") else "iops"


def _unit(test: str) -> str:
    return "ms" if test == "snapshot" else "MB/s" if test.startswith("seq") else "IOPS"


def run(size: int, work: Path, runtime: int, reps: int, cache_mb: int | None) -> dict[str, Any]:
    base = work / "base.raw"
    generate(base, size, seed=1, runs="zrt")
    cas = Casfs(work / "store", work / "casfs.mnt", cache_mb=cache_mb)
    cas.cli("init")
    t = time.perf_counter()
    cas.cli("image", "import", "base", base, "--format", "raw")
    import_s = time.perf_counter() - t
    samples: dict[str, dict[str, list[float]]] = {}
    peaks: dict[str, int] = {}
    for rep in range(reps):
        for peer in PEERS[rep % len(PEERS) :] + PEERS[: rep % len(PEERS)]:
            with fresh_disk(peer, work, base, rep, cache_mb) as disk:
                figures, peak = run_peer(peer, disk, size, runtime)
            peaks[peer] = max(peaks.get(peer, 0), peak)
            for test, value in figures.items():
                samples.setdefault(test, {}).setdefault(peer, []).append(value)
    medians = {t: {p: statistics.median(v) for p, v in by.items()} for t, by in samples.items()}
    return {
        "size": size,
        "runtime_s": runtime,
        "reps": reps,
        "cache_mb": cache_mb,
        "import_s": import_s,
        "results": medians,
        "samples": samples,
        "peak_rss_mib": {p: kib / 1024 for p, kib in peaks.items() if kib},
    }


def report_table(report: dict[str, Any]) -> str:
    rows = [
        Row(test, _unit(test), by_peer, higher_is_better=test != "snapshot")
        for test, by_peer in report["results"].items()
    ]
    rss = report["peak_rss_mib"]
    rows.append(Row("daemon peak RSS", "MiB", rss, higher_is_better=False))
    return table(rows, PEERS, bases=("qsd-qcow2", "qsd-raw"))


def main() -> int:
    from casfs.units import parse_size

    p = arguments(__doc__)
    p.add_argument("--size", default="1G")
    p.add_argument("--runtime", type=int, default=5, help="seconds per random test")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions (the median is shown)")
    p.add_argument("--cache-mb", type=int, default=None, help="the casfs daemon's chunk cache, MiB")
    args = p.parse_args()
    if not available():
        print("block_bench: qemu-storage-daemon is missing: run scripts/install-bench.sh", file=sys.stderr)
        return 1
    mounts = ("casfs.mnt", "qsd-raw.mnt", "qsd-qcow2.mnt")
    with scratch(args.workdir, "casfs-blockbench-", mounts=mounts) as work:
        report = run(parse_size(args.size), work, args.runtime, args.reps, args.cache_mb)
    heading = (
        f"{args.size} mixed image, fio, {os.cpu_count()} CPUs, median of {args.reps} interleaved runs, "
        f"qd16 = libaio iodepth=16; casfs import of the image {report['import_s']:.1f} s"
    )
    emit(report, args.json, heading, report_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
