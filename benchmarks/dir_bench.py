#!/usr/bin/env python3
"""A tree copied into a directory volume and walked, beside the native filesystem and
bindfs (a C FUSE passthrough), in one run.

    python benchmarks/dir_bench.py [--source /usr/share] [--rootfs DIR ...] [--workdir DIR] [--json]

The source tree (default /usr/share; its entry count is reported) is read once first
so every peer copies from the page cache, and a tarball of a root filesystem is made
first from this host's trees (--rootfs, default the Debian trees oci_bench uses: about
debian:bookworm's size), as a container runtime or debootstrap unpacks one.
Destinations: DIR/native/tree, bindfs over DIR/bindfs-src, pyfuse3_floor.py over
DIR/floor-src (the same Python FUSE stack as casfs with nothing of casfs in it: the
floor of any pure-Python daemon here), and a blank directory volume mounted with
`casfs mount MNT --volume tree` (as a runtime mounts a pod's volume).
Timed, in seconds, per peer:

  tar -x        tar -xf ROOTFS.tar -C DEST/rootfs (as root: owners and modes kept)
  cp -a         cp -a SOURCE DEST/tree
  ls -lR warm   ls -lR DEST/tree > /dev/null, right after one untimed run
  du -s warm    du -s DEST/tree
  find | wc -l  find DEST/tree | wc -l (checked against the source's count)
  ls -lR cold   after dropping the page cache and remounting (casfs: the unmount
                folded the copy into snapshot 1, and the tree is read from its blobs)

casfs's unmount after the copy and the tar (flush and snapshot) is timed too. Run as root.
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
    drop_caches,
    emit,
    is_mounted,
    scratch,
    sh,
    table,
    timed,
    unmount,
)

STEPS = ("tar -x", "cp -a", "ls -lR warm", "du -s warm", "find | wc -l", "ls -lR cold")
DIR_PEERS = ("native", "bindfs", "pyfuse3", "casfs")
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
    cas = Casfs(work / "store", work / "casfs", volume="tree")
    for d in (native, bind_src, bind_mnt, floor.source, floor.mnt, cas.mnt):
        d.mkdir()
    cas.cli("init")
    cas.cli("volume", "create", "tree", "--blank-dir")
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
        if peer == "casfs":
            cas.mount()
            return cas.mnt
        return native

    def umount(peer: str) -> None:
        if peer == "bindfs":
            unmount(bind_mnt)
        elif peer == "pyfuse3":
            floor.umount()
        elif peer == "casfs":
            t = time.perf_counter()
            cas.umount()
            extra.setdefault("casfs umount after tar and cp s", time.perf_counter() - t)

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
        cas.umount()
        unmount(cas.mnt)
    return {
        "source": str(source),
        "entries": entries,
        "rootfs": trees,
        "rootfs_entries": rootfs_entries,
        "results": results,
        "extra": extra,
        "dropped": dropped,
    }


def report_table(report: dict[str, Any]) -> str:
    rows = [Row(step, "s", by_peer, higher_is_better=False) for step, by_peer in report["results"].items()]
    out = [table(rows, DIR_PEERS, ("native", "bindfs", "pyfuse3"))]
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
    args = p.parse_args()
    with scratch(args.workdir, "casfs-dirbench-") as work:
        report = run(Path(args.source), work, args.rootfs)
    heading = (
        f"{report['source']}: {report['entries']} entries; rootfs tarball: {report['rootfs_entries']} "
        f"entries; {os.cpu_count()} CPUs; times in seconds "
        "(ratios above 1 are slower); casfs: a directory volume mounted alone"
    )
    emit(report, args.json, heading, report_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
