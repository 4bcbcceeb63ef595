#!/usr/bin/env python3
"""A tree copied into a directory volume and walked, beside the native filesystem and
bindfs (a C FUSE passthrough), in one run.

    python benchmarks/dir_bench.py [--source /usr/share] [--rootfs DIR ...] [--fio-size 256M]
                                   [--runtime 5] [--fio-only] [--workdir DIR] [--json]

The source tree (default /usr/share; its entry count is reported) is read once first
so every peer copies from the page cache, and a tarball of a root filesystem is made
first from this host's trees (--rootfs, default the Debian trees oci_bench uses: about
debian:bookworm's size), as a container runtime or debootstrap unpacks one.
Destinations: DIR/native/tree, bindfs over DIR/bindfs-src, pyfuse3_floor.py over
DIR/floor-src (the same Python FUSE stack as casfs with nothing of casfs in it: the
floor of any pure-Python daemon here), and a blank directory volume mounted with
`casfs mount MNT --volume tree` (as a runtime mounts a pod's volume), twice: with
passthrough (casfs, the default where the kernel offers it: a changed file is read and
written by the kernel itself, the daemon without the writeback cache) and with
`--no-passthrough` (casfs-wb: the kernel's writeback cache, every byte through the daemon).
Timed, in seconds, per peer:

  tar -x        tar -xf ROOTFS.tar -C DEST/rootfs (as root: owners and modes kept)
  cp -a         cp -a SOURCE DEST/tree
  ls -lR warm   ls -lR DEST/tree > /dev/null, right after one untimed run
  du -s warm    du -s DEST/tree
  find | wc -l  find DEST/tree | wc -l (checked against the source's count)
  ls -lR cold   after dropping the page cache and remounting (casfs: the unmount
                folded the copy into snapshot 1, and the tree is read from its blobs)

casfs's unmount after the copy and the tar (flush and snapshot) is timed too.

Then a changed file (fio, --fio-size, page cache warm): a file written, the volume
unmounted (the file folded into blobs) and mounted again, one byte of the file
rewritten (its copy-up), then on that file: seq write 1M, rand write 4K, seq read 1M,
rand read 4K (psync, qd1; random ones --runtime seconds). Run as root.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import (
    NOT_DROPPED,
    ROOTFS_TREES,
    Casfs,
    Row,
    arguments,
    describe,
    drop_caches,
    emit,
    fio,
    fio_rows,
    is_mounted,
    scratch,
    sh,
    table,
    timed,
    unmount,
)

from casfs.units import parse_size

STEPS = ("tar -x", "cp -a", "ls -lR warm", "du -s warm", "find | wc -l", "ls -lR cold")
DIR_PEERS = ("native", "bindfs", "pyfuse3", "casfs", "casfs-wb")
FIO_PEERS = ("native", "casfs", "casfs-wb")
_WARM = ["--ioengine=psync", "--invalidate=0"]  # (page cache warm: fio would drop it first)
_RAND = ["--bs=4k", *_WARM, "--time_based", "--randrepeat=0"]
FIO_TESTS = {
    "seq write 1M": ["--rw=write", "--bs=1M", *_WARM, "--refill_buffers"],
    "rand write 4K": ["--rw=randwrite", *_RAND, "--refill_buffers"],
    "seq read 1M": ["--rw=read", "--bs=1M", *_WARM],
    "rand read 4K": ["--rw=randread", *_RAND],
}
FLOOR = Path(__file__).resolve().parent / "pyfuse3_floor.py"


class Foreground:
    """A FUSE daemon run in the foreground (`argv` SOURCE MOUNTPOINT: its pid is the
    daemon's), ended by unmount."""

    argv: tuple[str, ...] = ()

    def __init__(self, source: Path, mnt: Path) -> None:
        self.source, self.mnt = source, mnt
        self.proc: subprocess.Popen[bytes] | None = None

    def mount(self) -> None:
        self.proc = subprocess.Popen([*self.argv, self.source, self.mnt])
        deadline = time.monotonic() + 30
        while not is_mounted(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.argv[-1]} did not mount {self.mnt}")
            time.sleep(0.05)

    def umount(self) -> None:
        unmount(self.mnt)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait()
            self.proc = None


class Floor(Foreground):
    """pyfuse3_floor.py's daemon over `source` on `mnt`."""

    argv = (sys.executable, str(FLOOR))


def count_entries(top: Path) -> int:
    out = subprocess.run(
        ["bash", "-c", f"find '{top}' | wc -l"], capture_output=True, text=True, timeout=600, check=True
    )
    return int(out.stdout.strip())


def make_rootfs(work: Path, trees: list[str]) -> tuple[Path, int]:
    """A tarball of `trees` (paths relative to /, as in a rootfs) and its entry count."""
    tarball = work / "rootfs.tar"
    names = [t.lstrip("/") for t in trees]
    sh("tar", "-C", "/", "-cf", tarball, *names, timeout=600)
    listed = subprocess.run(["tar", "-tf", tarball], capture_output=True, check=True, timeout=600)
    return tarball, len(listed.stdout.splitlines())


def run(source: Path, work: Path, trees: list[str]) -> dict[str, Any]:
    entries = count_entries(source)
    tarball, rootfs_entries = make_rootfs(work, trees)
    timed(f"tar cf - '{source}' 2>/dev/null | cat > /dev/null")  # the source into the page cache
    native = work / "native"
    bind_src, bind_mnt = work / "bindfs-src", work / "bindfs"
    floor = Floor(work / "floor-src", work / "floor")
    cas = casfs_peers(work)
    for d in (native, bind_src, bind_mnt, floor.source, floor.mnt, *(c.mnt for c in cas.values())):
        d.mkdir()
    results: dict[str, dict[str, float]] = {s: {} for s in STEPS}
    extra: dict[str, float] = {}
    dropped = True

    def mount(peer: str) -> Path:
        if peer == "bindfs":
            sh("bindfs", bind_src, bind_mnt, timeout=60)
            return bind_mnt
        if peer == "pyfuse3":
            floor.mount()
            return floor.mnt
        if peer in cas:
            cas[peer].mount()
            return cas[peer].mnt
        return native

    def umount(peer: str) -> None:
        if peer == "bindfs":
            unmount(bind_mnt)
        elif peer == "pyfuse3":
            floor.umount()
        elif peer in cas:
            t = time.perf_counter()
            cas[peer].umount()
            extra.setdefault(f"{peer} umount after tar and cp s", time.perf_counter() - t)

    try:
        for peer in DIR_PEERS:
            top = mount(peer)
            (top / "rootfs").mkdir()
            results["tar -x"][peer] = timed(f"tar -xf '{tarball}' -C '{top / 'rootfs'}'", timeout=1800)
            dest = top / "tree"
            results["cp -a"][peer] = timed(f"cp -a '{source}' '{dest}'", timeout=1800)
            timed(f"ls -lR '{dest}' > /dev/null")
            results["ls -lR warm"][peer] = timed(f"ls -lR '{dest}' > /dev/null")
            results["du -s warm"][peer] = timed(f"du -s '{dest}' > /dev/null")
            t = time.perf_counter()
            found = count_entries(dest)
            results["find | wc -l"][peer] = time.perf_counter() - t
            if found != entries:
                raise RuntimeError(f"{peer}: {found} entries copied, the source has {entries}")
            umount(peer)
            dropped = drop_caches() and dropped
            top = mount(peer)
            results["ls -lR cold"][peer] = timed(f"ls -lR '{top / 'tree'}' > /dev/null")
            umount(peer)
            for step in STEPS:
                print(f"  {peer:7} {step:14} {results[step][peer]:8.2f} s", file=sys.stderr)
    finally:
        unmount(bind_mnt)
        floor.umount()
        for c in cas.values():
            c.umount()
            unmount(c.mnt)
    return {
        "source": str(source),
        "entries": entries,
        "rootfs": trees,
        "rootfs_entries": rootfs_entries,
        "results": results,
        "extra": extra,
        "dropped": dropped,
    }


def casfs_peers(work: Path) -> dict[str, Casfs]:
    """casfs with passthrough (its default) and with the writeback cache, each its own
    store with a blank directory volume `tree`."""
    peers = {
        "casfs": Casfs(work / "store", work / "casfs", volume="tree"),
        "casfs-wb": Casfs(work / "store-wb", work / "casfs-wb", volume="tree", args=["--no-passthrough"]),
    }
    for c in peers.values():
        c.cli("init")
        c.cli("volume", "create", "tree", "--blank-dir")
    return peers


def run_fio(work: Path, size: int, runtime: int) -> dict[str, dict[str, dict[str, float]]]:
    """The changed-file tests per peer (FIO_TESTS), casfs's file copied up from blobs."""
    native = work / "native-fio"
    native.mkdir()
    (work / "fio").mkdir()
    cas = casfs_peers(work / "fio")
    results: dict[str, dict[str, dict[str, float]]] = {t: {} for t in FIO_TESTS}
    try:
        for peer in FIO_PEERS:
            top = native
            if peer in cas:
                c = cas[peer]
                c.mnt.mkdir()
                c.mount()
                fio(c.mnt / "file", ["--rw=write", "--bs=1M", "--ioengine=psync", "--refill_buffers"], size)
                c.umount()  # (folded: the file's bytes are in blobs)
                c.mount()
                top = c.mnt
            path = top / "file"
            if peer == "native":
                fio(path, ["--rw=write", "--bs=1M", "--ioengine=psync", "--refill_buffers"], size)
            with open(path, "r+b") as f:  # the file changed: copied up (casfs)
                f.write(b"x")
            for test, args in FIO_TESTS.items():
                timed_args = [f"--runtime={runtime}"] if "--time_based" in args else []
                results[test][peer] = fio(path, [*args, *timed_args], size)
                print(f"  {peer:8} {test:14} {describe(test, results[test][peer])}", file=sys.stderr)
            if peer in cas:
                cas[peer].umount()
    finally:
        for c in cas.values():
            c.umount()
            unmount(c.mnt)
    return results


def report_table(report: dict[str, Any]) -> str:
    out = []
    if report.get("fio"):
        fio_table = table(fio_rows(report["fio"]), FIO_PEERS, ("native", "casfs-wb"))
        out += [f"a changed file of {report['fio_size']} bytes:", fio_table]
    if not report.get("results"):
        return "\n".join(out)
    rows = [Row(step, "s", by_peer, higher_is_better=False) for step, by_peer in report["results"].items()]
    out += [table(rows, DIR_PEERS, ("native", "bindfs", "pyfuse3", "casfs-wb"))]
    for key, value in report["extra"].items():
        out.append(f"{key}: {value:.2f}")
    if not report["dropped"]:
        out.append(NOT_DROPPED)
    return "\n".join(out)


def main() -> int:
    p = arguments(__doc__)
    p.add_argument("--source", default="/usr/share")
    p.add_argument(
        "--rootfs", nargs="+", default=list(ROOTFS_TREES), help="host trees the tarball is made of"
    )
    p.add_argument("--fio-size", type=parse_size, default=parse_size("256M"))
    p.add_argument("--runtime", type=int, default=5, help="seconds per random fio test")
    p.add_argument("--fio-only", action="store_true", help="only the changed-file tests")
    args = p.parse_args()
    mounts = ("casfs", "casfs-wb", "bindfs", "floor", "fio/casfs", "fio/casfs-wb")
    with scratch(args.workdir, "casfs-dirbench-", mounts) as work:
        report: dict[str, Any] = {"fio_size": args.fio_size}
        report["fio"] = run_fio(work, args.fio_size, args.runtime)
        if not args.fio_only:
            report.update(run(Path(args.source), work, args.rootfs))
    heading = (
        f"{report.get('source', '-')}: {report.get('entries', '-')} entries; rootfs tarball: "
        f"{report.get('rootfs_entries', '-')} entries; {os.cpu_count()} CPUs; times in seconds "
        "(ratios above 1 are slower), fio in MB/s or IOPS (below 1 slower); casfs: a directory "
        "volume mounted alone, with passthrough; casfs-wb: --no-passthrough (the writeback cache)"
    )
    emit(report, args.json, heading, report_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
