#!/usr/bin/env python3
"""A clone of a disk image under a hypervisor's I/O: casfs beside qemu-storage-daemon's
FUSE export of a qcow2 overlay and of a raw copy, and the native file, in one run.

    python benchmarks/block_bench.py [--size 1G] [--runtime 5] [--reps 3]
                                     [--snapshot-sizes 1M,64M,1G] [--clone-runs 3]
                                     [--rss-runtime 5] [--cache-mb N] [--workdir DIR] [--json]

One base image (a third zeros, a third random, a third text: benchmarks/import_speed.py's
generator) is presented four ways, each made fresh for every repetition:

  native     a copy of the image on the work directory's filesystem
  qsd-raw    a copy of the image exported by qemu-storage-daemon over FUSE
  qsd-qcow2  a qcow2 overlay on the image (`qemu-img create -b`), exported the same way
  casfs      the image imported once, a volume cloned from it per repetition
             (`casfs volume create --from`), mounted on a file (`casfs mount FILE --volume`)
  casfs-pt   the same clone mounted read-only (`--ro`): the block image served by FUSE
             passthrough from the whole-file cache (STORE/cache/files), once its
             background fill is done (the first open queues it; "pt cache fill" is how
             long it took, "pt cache on disk" what it takes, in the repetition that
             filled it); read tests only

Every peer runs the same sequence on its fresh disk; the peers' order rotates between
repetitions (interleaved), and each figure is the median over repetitions:

  seq read cold    1 MiB buffered reads of the whole disk (the image's content)
  rand read qd1    4 KiB O_DIRECT random reads, one at a time (psync)
  rand read qd16   the same, 16 in flight (libaio iodepth=16: qemu's aio=native)
  rand write qd1   4 KiB O_DIRECT random writes, one at a time
  rand write qd16  the same, 16 in flight
  seq write+fsync  1 MiB writes of non-zero data over the whole disk, then fsync; MB/s
                   over the wall time, the fsync included
  snapshot         after the writes above, ms: casfs `setfattr -n user.casfs.snapshot`
                   on the mounted file; qsd-qcow2 `qemu-img create -f qcow2 -b` of a new
                   overlay on the exported one (see "snapshot, N written")

Then, in the same repetitions and the same rotation, each on a fresh disk:

  snapshot, N written   for each N of --snapshot-sizes no larger than the disk: N of
                   random bytes written from offset 0 (fio, 1 MiB O_DIRECT writes,
                   one fdatasync at the end), then the snapshot timed, ms; it should
                   not grow with N. casfs: the setfattr above, which returns once the
                   written state is frozen as the snapshot; "folded, N written" is the
                   time until its background fold has stored it as blobs (content-
                   addressed, its new map committed: the catalog has no frozen epoch
                   left), and "fold rate, N written" is N over that time, MB/s. qsd-qcow2: an
                   internal snapshot (`qemu-img snapshot -c`) of an image in use is
                   refused, so its figure is the external one: `qemu-img create -f qcow2
                   -b OVERLAY -F qcow2 NEW` while the daemon still exports OVERLAY (what a
                   hypervisor's live snapshot creates, without switching the export to it)
  RSS after rand writes  the daemon restarted, then 4 KiB O_DIRECT random writes at qd16
                   until 1 GiB is written or --rss-runtime seconds pass; the daemon's
                   VmHWM, MiB, and "written for RSS", what was written in that time, MiB
  clone            --clone-runs times per repetition, alternating: `casfs volume create
                   NAME --from IMAGE` (a Python process start included) beside `qemu-img
                   create -f qcow2 -F raw -b BASE OVERLAY`; wall ms. "clone by xattr":
                   `setfattr -n user.casfs.clone -v NAME MNT/images/IMAGE` in a whole-store
                   mount, beside the same qemu-img runs

Before each read test the page cache is dropped and every FUSE daemon restarted, so
neither the kernel nor a daemon's own cache holds the data. Write buffers are
refilled for every write and half compressible, so nothing dedups fio's buffer. The
daemons' peak resident memory (VmHWM) over the test sequence is read before each
stops ("daemon peak RSS"). Ratios are casfs over qsd-qcow2 (the target) and over
qsd-raw: for a rate below 1 is slower, for ms or MiB above 1 is worse. Run as root
(drop_caches, mounts); the peers are installed by scripts/install-bench.sh.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from benchlib import (
    MIB,
    Casfs,
    Row,
    arguments,
    drop_caches,
    emit,
    fio,
    generate,
    memory_kib,
    scratch,
    sh,
    stop_on_sigterm,
    table,
    wait_file_cache,
)
from qsd import Qsd, available

PEERS = ("native", "qsd-raw", "qsd-qcow2", "casfs", "casfs-pt")
READ_ONLY = ("casfs-pt",)  # peers that take the read tests only
SNAPSHOT_PEERS = ("qsd-qcow2", "casfs")  # the two that have a snapshot of a disk in use
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
# Random writes until 1 GiB is written or the runtime (given per run) is up: not time_based.
RSS_WRITES = ["--rw=randwrite", "--bs=4k", "--direct=1", "--randrepeat=0", "--io_size=1G", *_QD16, *_DATA]

Samples = dict[str, dict[str, list[float]]]  # row -> peer -> one figure per repetition


class Disk(Protocol):
    path: Path

    def restart(self) -> None: ...
    def pid(self) -> int | None: ...
    def snapshot(self, label: str) -> None: ...


class NativeDisk:
    def __init__(self, path: Path) -> None:
        self.path = path

    def restart(self) -> None:
        pass

    def pid(self) -> int | None:
        return None

    def snapshot(self, label: str) -> None:
        raise NotImplementedError("a raw file has no snapshot")


class QsdDisk:
    def __init__(self, qsd: Qsd) -> None:
        self.qsd, self.path = qsd, qsd.mnt
        self.made: list[Path] = []  # the snapshots' overlays, removed with the disk

    def restart(self) -> None:
        self.qsd.restart()

    def pid(self) -> int | None:
        return self.qsd.pid

    def snapshot(self, label: str) -> None:
        """qcow2's live external snapshot, as far as the command line goes: a new overlay
        on the image the daemon exports (an internal one is refused while it is open)."""
        if self.qsd.fmt != "qcow2":
            raise NotImplementedError("qsd-raw: snapshots are measured on the qcow2 overlay")
        new = self.qsd.image.with_name(f"{self.qsd.image.name}.{label}")
        self.made.append(new)
        sh("qemu-img", "create", "-q", "-f", "qcow2", "-b", self.qsd.image, "-F", "qcow2", new, timeout=60)


class CasfsDisk:
    def __init__(self, cas: Casfs) -> None:
        self.cas, self.path = cas, cas.mnt

    def restart(self) -> None:
        self.cas.umount()
        self.cas.mount()

    def pid(self) -> int | None:
        return self.cas.pid()

    def snapshot(self, label: str) -> None:
        sh("setfattr", "-n", "user.casfs.snapshot", "-v", label, self.path, timeout=600)

    def wait_folded(self, timeout: float = 600) -> None:
        """Until no snapshot of the volume waits for its background fold: its catalog's
        uppers rows frozen as a snapshot are gone (read-only; a CLI call per poll
        would cost more than the polling interval)."""
        db = f"file:{self.cas.store / 'catalog.db'}?mode=ro"
        query = "SELECT count(*) FROM uppers WHERE volume = ? AND snapshot IS NOT NULL"
        deadline = time.monotonic() + timeout
        with contextlib.closing(sqlite3.connect(db, uri=True, timeout=30)) as conn:
            while conn.execute(query, (self.cas.volume,)).fetchone()[0]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the fold of {self.cas.volume} did not finish in {timeout:.0f} s")
                time.sleep(0.005)


@contextmanager
def fresh_disk(peer: str, work: Path, base: Path, name: str, cache_mb: int | None) -> Iterator[Disk]:
    """The peer's disk made anew from the base image, mounted; undone afterwards (a
    casfs clone is the volume `name`)."""
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
        ro = ("--ro",) if peer in READ_ONLY else ()
        cas = Casfs(work / "store", work / f"{peer}.mnt", volume=name, cache_mb=cache_mb, args=ro)
        cas.cli("volume", "create", name, "--from", "base")
        cas.mnt.touch()
        try:
            cas.mount()
            if ro:
                fill_passthrough_cache(cas)
            yield CasfsDisk(cas)
        finally:
            cas.umount()
            cas.cli("volume", "rm", name)
        return
    disk = QsdDisk(qsd)
    try:
        qsd.mount()
        yield disk
    finally:
        qsd.umount()
        for made in [qsd.image, *disk.made]:
            made.unlink(missing_ok=True)


FILLS: dict[str, float] = {}  # the passthrough cache's fill, s, and its size on disk, MiB


def fill_passthrough_cache(cas: Casfs) -> None:
    """Open the block image once (which queues its background fill), wait for the fill;
    its time and disk cost are kept when it had to fill."""
    with open(cas.mnt, "rb") as f:
        f.read(4096)
    secs = wait_file_cache(cas.mnt)
    files = list((cas.store / "cache" / "files").iterdir())
    if secs > 0.5 or "pt cache fill" not in FILLS:
        FILLS["pt cache fill"] = secs
        FILLS["pt cache on disk"] = sum(p.stat().st_blocks * 512 for p in files) / MIB


def run_peer(peer: str, disk: Disk, size: int, runtime: int) -> tuple[dict[str, float], int]:
    """The test sequence on one fresh disk: each test's figure, and the daemon's VmHWM."""
    figures: dict[str, float] = {}
    peak = 0
    for test, args in TESTS.items():
        if peer in READ_ONLY and "read" not in test:
            continue
        if "read" in test:
            peak = max(peak, memory_kib(disk.pid()).get("VmHWM", 0))
            disk.restart()
            drop_caches()
        timed_args = [f"--runtime={runtime}"] if "--time_based" in args else []
        t = time.perf_counter()
        got = fio(disk.path, [*args, *timed_args], size)
        wall = time.perf_counter() - t
        figures[test] = size / wall / 1e6 if test.startswith("seq write") else got[_key(test)]
        _progress(peer, test, figures[test])
    if peer in SNAPSHOT_PEERS:
        figures["snapshot"] = _ms(disk.snapshot, "bench")
        _progress(peer, "snapshot", figures["snapshot"])
    peak = max(peak, memory_kib(disk.pid()).get("VmHWM", 0))
    return figures, peak


def write_random(path: Path, n: int) -> None:
    """`n` random bytes (a whole number of MiB) from offset 0: 1 MiB O_DIRECT writes,
    then one fdatasync; every buffer is new random bytes (fio's generator: /dev/urandom
    would cost more CPU than the disk), so nothing in them dedups or compresses. (fio's
    --fdatasync=N syncs before a next write, never after the last: the sync is ours.)"""
    fio(path, ["--rw=write", "--bs=1M", "--direct=1", "--ioengine=psync", "--refill_buffers"], n)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def snapshot_after(disk: Disk, peer: str, label: str, n: int) -> dict[str, float]:
    """Ms of the disk's snapshot once `n` random bytes are written and fdatasync'd; for
    casfs also ms until its background fold has stored the snapshot as blobs."""
    write_random(disk.path, n)
    start = time.perf_counter()
    disk.snapshot(f"after-{label}")
    figures = {f"snapshot, {label} written": (time.perf_counter() - start) * 1000}
    if isinstance(disk, CasfsDisk):
        disk.wait_folded()
        figures[f"folded, {label} written"] = (time.perf_counter() - start) * 1000
    for test, value in figures.items():
        _progress(peer, test, value)
    return figures


def rss_after_writes(disk: Disk, peer: str, size: int, runtime: int) -> dict[str, float]:
    """A new daemon's peak RSS (MiB) after random 4 KiB writes (1 GiB or `runtime` s),
    and how many MiB it was given in that time."""
    disk.restart()
    got = fio(disk.path, [*RSS_WRITES, f"--runtime={runtime}"], size)
    figures = {
        "RSS after rand writes": memory_kib(disk.pid()).get("VmHWM", 0) / 1024,
        "written for RSS": got["bytes"] / MIB,
    }
    for test, value in figures.items():
        _progress(peer, test, value)
    return figures


def clone_times(base: Path, work: Path, rep: int, runs: int, cache_mb: int | None) -> Samples:
    """Wall ms of `runs` clones of the base image each way, alternating: a qcow2 overlay
    by qemu-img, a casfs volume by the CLI ("clone") and by xattr in a whole-store mount
    ("clone by xattr"). The clones are left for the scratch's end."""
    cas = Casfs(work / "store", work / "casfs.mnt", cache_mb=cache_mb)
    qemu: list[float] = []
    times: Samples = {
        "clone": {"qsd-qcow2": qemu, "casfs": []},
        "clone by xattr": {"qsd-qcow2": qemu, "casfs": []},
    }
    whole = Casfs(work / "store", work / "store.mnt")
    whole.mnt.mkdir(exist_ok=True)
    with whole.mounted() as mnt:
        for i in range(runs):
            overlay = work / f"clone-{rep}-{i}.qcow2"
            qemu.append(_ms(sh, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, overlay))
            overlay.unlink()
            times["clone"]["casfs"].append(
                _ms(cas.cli, "volume", "create", f"cl-{rep}-{i}", "--from", "base")
            )
            clone = ("setfattr", "-n", "user.casfs.clone", "-v", f"cx-{rep}-{i}", mnt / "images" / "base")
            times["clone by xattr"]["casfs"].append(_ms(sh, *clone))
    for test, by in times.items():
        for peer, ms in by.items():
            _progress(peer, test, statistics.median(ms))
    return times


def _ms(fn: Callable[..., object], *args: str | Path) -> float:
    """Wall milliseconds of fn(*args)."""
    t = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - t) * 1000


def _progress(peer: str, test: str, value: float) -> None:
    print(f"  {peer:9} {test:24} {value:10.1f} {_unit(test)}", file=sys.stderr)


def _key(test: str) -> str:
    return "mbps" if test.startswith("seq") else "iops"


def _unit(test: str) -> str:
    if test.startswith(("snapshot", "clone", "folded")):
        return "ms"
    if test == "pt cache fill":
        return "s"
    if test.startswith(("daemon", "RSS", "written", "pt cache")):
        return "MiB"
    return "MB/s" if test.startswith(("seq", "fold")) else "IOPS"


def _rotated(peers: tuple[str, ...], rep: int) -> tuple[str, ...]:
    return peers[rep % len(peers) :] + peers[: rep % len(peers)]


def run(
    size: int,
    work: Path,
    runtime: int,
    reps: int,
    cache_mb: int | None,
    snapshot_sizes: dict[str, int],
    clone_runs: int,
    rss_runtime: int,
) -> dict[str, Any]:
    base = work / "base.raw"
    generate(base, size, seed=1, runs="zrt")
    cas = Casfs(work / "store", work / "casfs.mnt", cache_mb=cache_mb)
    cas.cli("init")
    t = time.perf_counter()
    cas.cli("image", "import", "base", base, "--format", "raw")
    import_s = time.perf_counter() - t
    samples: Samples = {}
    peaks: dict[str, int] = {}

    def add(peer: str, figures: dict[str, float]) -> None:
        for test, value in figures.items():
            samples.setdefault(test, {}).setdefault(peer, []).append(value)

    for rep in range(reps):
        for peer in _rotated(PEERS, rep):
            with fresh_disk(peer, work, base, f"clone{rep}", cache_mb) as disk:
                figures, peak = run_peer(peer, disk, size, runtime)
            peaks[peer] = max(peaks.get(peer, 0), peak)
            add(peer, figures)
        for peer in _rotated(SNAPSHOT_PEERS, rep):
            for label, n in snapshot_sizes.items():
                with fresh_disk(peer, work, base, f"snap{rep}-{label}", cache_mb) as disk:
                    add(peer, snapshot_after(disk, peer, label, n))
            with fresh_disk(peer, work, base, f"rss{rep}", cache_mb) as disk:
                add(peer, rss_after_writes(disk, peer, size, rss_runtime))
        for test, by in clone_times(base, work, rep, clone_runs, cache_mb).items():
            for peer, times in by.items():
                samples.setdefault(test, {}).setdefault(peer, []).extend(times)
    medians = {t: {p: statistics.median(v) for p, v in by.items()} for t, by in samples.items()}
    for test, value in FILLS.items():
        medians[test] = {"casfs-pt": value}
    for label, n in snapshot_sizes.items():
        fold_ms = medians[f"folded, {label} written"]["casfs"]
        medians[f"fold rate, {label} written"] = {"casfs": n / 1e6 / (fold_ms / 1000)}
    return {
        "size": size,
        "runtime_s": runtime,
        "reps": reps,
        "cache_mb": cache_mb,
        "snapshot_sizes": snapshot_sizes,
        "clone_runs": clone_runs,
        "rss_runtime_s": rss_runtime,
        "import_s": import_s,
        "results": medians,
        "samples": samples,
        "peak_rss_mib": {p: kib / 1024 for p, kib in peaks.items() if kib},
    }


def report_table(report: dict[str, Any]) -> str:
    results = dict(report["results"])
    results["daemon peak RSS"] = report["peak_rss_mib"]
    order = [*TESTS, "snapshot", "daemon peak RSS", "RSS after rand writes", "written for RSS"]
    for label in report["snapshot_sizes"]:
        order += [f"snapshot, {label} written", f"folded, {label} written", f"fold rate, {label} written"]
    order += ["clone", "clone by xattr"]
    order += list(FILLS)
    rows = [Row(test, _unit(test), results[test]) for test in order if test in results]
    return "\n".join([table(rows, PEERS, bases=("qsd-qcow2", "qsd-raw")), "targets:", *verdicts(results)])


# (row, subject, peer, bound): the ratios (rates: higher is better)
TARGETS = (
    ("seq read cold", "casfs-pt", "qsd-raw", 1.5),
    ("rand read qd1", "casfs-pt", "qsd-raw", 1.5),
    ("rand read qd16", "casfs-pt", "qsd-raw", 1.5),
    ("rand read qd1", "casfs", "qsd-qcow2", 1.0),
    ("rand read qd16", "casfs", "qsd-qcow2", 0.7),
)


def verdicts(results: dict[str, dict[str, float]]) -> list[str]:
    out = []
    for test, subject, peer, bound in TARGETS:
        have, other = results.get(test, {}).get(subject), results.get(test, {}).get(peer)
        if have is None or not other:
            continue
        met = "met" if have / other >= bound else "MISSED"
        out.append(f"  {test:16} {subject}/{peer} {have / other:5.2f}x (target >= {bound}x): {met}")
    return out


def main() -> int:
    from casfs.units import parse_size

    p = arguments(__doc__)
    p.add_argument("--size", default="1G")
    p.add_argument("--runtime", type=int, default=5, help="seconds per random test")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions (the median is shown)")
    p.add_argument("--cache-mb", type=int, default=None, help="the casfs daemon's chunk cache, MiB")
    p.add_argument(
        "--snapshot-sizes",
        default="1M,64M,1G",
        help="amounts written before a timed snapshot (whole MiB; those above --size are skipped)",
    )
    p.add_argument("--clone-runs", type=int, default=3, help="clones timed each way per repetition")
    p.add_argument("--rss-runtime", type=int, default=5, help="at most this many seconds of writes for RSS")
    args = p.parse_args()
    if not available():
        print("block_bench: qemu-storage-daemon is missing: run scripts/install-bench.sh", file=sys.stderr)
        return 1
    size = parse_size(args.size)
    snapshot_sizes: dict[str, int] = {}
    for label in args.snapshot_sizes.split(","):
        n = parse_size(label)
        if n <= 0 or n % MIB:
            p.error(f"--snapshot-sizes: {label} is not a whole number of MiB")
        if n > size:
            print(f"block_bench: snapshot after {label} skipped: the disk is {args.size}", file=sys.stderr)
        else:
            snapshot_sizes[label] = n
    mounts = ("casfs.mnt", "casfs-pt.mnt", "store.mnt", "qsd-raw.mnt", "qsd-qcow2.mnt")
    stop_on_sigterm()
    with scratch(args.workdir, "casfs-blockbench-", mounts=mounts) as work:
        report = run(
            size,
            work,
            args.runtime,
            args.reps,
            args.cache_mb,
            snapshot_sizes,
            args.clone_runs,
            args.rss_runtime,
        )
    heading = (
        f"{args.size} mixed image, fio, {os.cpu_count()} CPUs, median of {args.reps} interleaved runs, "
        f"qd16 = libaio iodepth=16; casfs import of the image {report['import_s']:.1f} s; "
        f"RSS writes at most {args.rss_runtime} s; clone: median of {args.reps * args.clone_runs}"
    )
    emit(report, args.json, heading, report_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
