#!/usr/bin/env python3
"""Per-request cost of a directory volume: casfs source trees beside bindfs and the
pyfuse3 floor, interleaved.

    python benchmarks/dir_ops.py [--trees main=/work/main,new=.] [--source /usr/share]
                                 [--rootfs DIR ...] [--reps 2] [--no-peers]
                                 [--workdir DIR] [--json]

dir_bench.py's two write steps, `tar -x` of a root filesystem's tarball and `cp -a
SOURCE`, into a fresh destination of each peer in turn, the order rotating between
repetitions: bindfs (C, libfuse), pyfuse3_floor.py (the same Python stack with nothing
of casfs in it) and a blank directory volume per casfs tree (its daemon runs that
tree's code: PYTHONPATH). What each wrote is kept until the end: on an ext4 without a
journal (this machine's) a create scans past the inodes deleted in the last minutes,
so a peer run right after a deletion would pay for it. For each step: seconds, the
daemon's CPU (user+system, from /proc/PID/stat) and the FUSE requests the kernel sent
it (perf counting the fuse_request_send tracepoint of that mount's connection), hence
CPU per request: on a machine shared with other work, seconds follow the load, CPU per
request much less. casfs's unmount (flush and snapshot) is not timed here (dir_bench.py
times it). Run as
root.
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from benchlib import ROOTFS_TREES, Casfs, arguments, cpu_s, emit, scratch, stop_on_sigterm, unmount
from dir_bench import Floor, Foreground, count_entries, make_rootfs

STEPS = ("tar -x", "cp -a")


def requests_and_seconds(mnt: Path, cmd: str) -> tuple[float, int | None]:
    """Run `cmd`; its seconds and the FUSE requests sent to the mount on `mnt` meanwhile
    (None without perf)."""
    if shutil.which("perf") is None:
        t = time.perf_counter()
        subprocess.run(["bash", "-o", "pipefail", "-c", cmd], check=True, capture_output=True)
        return time.perf_counter() - t, None
    with tempfile.NamedTemporaryFile("r", suffix=".perf") as out:
        perf = ["perf", "stat", "-x,", "-o", out.name, "-e", "fuse:fuse_request_send"]
        perf += ["--filter", f"connection == {os.stat(mnt).st_dev}", "-a", "--"]
        t = time.perf_counter()
        subprocess.run([*perf, "bash", "-o", "pipefail", "-c", cmd], check=True, capture_output=True)
        elapsed = time.perf_counter() - t
        counted = [line.split(",")[0] for line in out.read().splitlines() if "fuse_request_send" in line]
    return elapsed, int(counted[0]) if counted and counted[0].isdigit() else None


class Bindfs(Foreground):
    """bindfs in the foreground over `source` on `mnt`."""

    argv = ("bindfs", "-f")


@contextmanager
def mounted(peer: str, work: Path, trees: dict[str, str], rep: int) -> Iterator[tuple[Path, int]]:
    """A fresh destination of `peer`: (its top, the daemon's pid)."""
    top = work / f"{peer}{rep}"
    src, mnt = top / "src", top / "mnt"
    src.mkdir(parents=True)
    mnt.mkdir()
    if peer in trees:
        cas = Casfs(work / "store", mnt, volume=f"{peer}{rep}")
        cas.env["PYTHONPATH"] = trees[peer]
        cas.cli("volume", "create", cas.volume or "", "--blank-dir")
        cas.mount()
        try:
            pid = cas.pid()
            assert pid is not None
            yield mnt, pid
        finally:
            with suppress(RuntimeError):
                cas.umount()
            unmount(mnt)
        return
    daemon = Bindfs(src, mnt) if peer == "bindfs" else Floor(src, mnt)
    daemon.mount()
    try:
        assert daemon.proc is not None
        yield mnt, daemon.proc.pid
    finally:
        daemon.umount()


def run(args: Any, work: Path, trees: dict[str, str], peers: list[str]) -> dict[str, Any]:
    source = Path(args.source)
    entries = count_entries(source)
    tarball, rootfs_entries = make_rootfs(work, args.rootfs)
    subprocess.run(["bash", "-c", f"tar cf - '{source}' 2>/dev/null | cat > /dev/null"], check=True)
    first = Casfs(work / "store", work / "unused")
    first.env["PYTHONPATH"] = next(iter(trees.values()))
    first.cli("init")
    samples: dict[str, dict[str, list[dict[str, float]]]] = {s: {} for s in STEPS}
    for rep in range(args.reps):
        for peer in peers[2 * rep % len(peers) :] + peers[: 2 * rep % len(peers)]:
            with mounted(peer, work, trees, rep) as (mnt, pid):
                (mnt / "rootfs").mkdir()
                cmds = {
                    "tar -x": f"tar -xf '{tarball}' -C '{mnt / 'rootfs'}'",
                    "cp -a": f"cp -a '{source}' '{mnt / 'tree'}'",
                }
                for step, cmd in cmds.items():
                    c0 = sum(cpu_s(pid))
                    seconds, reqs = requests_and_seconds(mnt, cmd)
                    cpu = sum(cpu_s(pid)) - c0
                    fig = {"s": seconds, "cpu_s": cpu, "requests": float(reqs or 0)}
                    samples[step].setdefault(peer, []).append(fig)
                    per = f"{cpu / reqs * 1e6:6.1f} us/req" if reqs else ""
                    line = f"{seconds:7.2f} s  CPU {cpu:6.2f} s  {reqs or 0:8d} req {per}"
                    print(f"  {rep} {peer:8} {step:7} {line}  load {os.getloadavg()[0]:.1f}", file=sys.stderr)
                found = count_entries(mnt / "tree")
                if found != entries:
                    raise RuntimeError(f"{peer}: {found} entries copied, the source has {entries}")
    results = {
        step: {
            peer: {key: statistics.median(f[key] for f in figs) for key in ("s", "cpu_s", "requests")}
            for peer, figs in by_peer.items()
        }
        for step, by_peer in samples.items()
    }
    return {
        "source": str(source),
        "entries": entries,
        "rootfs_entries": rootfs_entries,
        "trees": trees,
        "results": results,
        "samples": samples,
    }


def report_table(report: dict[str, Any], peers: list[str]) -> str:
    head = f"{'step':8} {'peer':9} {'s':>8} {'CPU s':>8} {'requests':>9} {'us/req':>7}"
    lines = [f"{head} {'/bindfs':>8} {'/floor':>7}"]
    for step, by_peer in report["results"].items():
        for peer in peers:
            r = by_peer[peer]
            per = r["cpu_s"] / r["requests"] * 1e6 if r["requests"] else 0.0
            ratios = [
                f"{r['s'] / by_peer[b]['s']:7.2f}x" if b in by_peer else f"{'-':>8}"
                for b in ("bindfs", "pyfuse3")
            ]
            lines.append(
                f"{step:8} {peer:9} {r['s']:8.2f} {r['cpu_s']:8.2f} {r['requests']:9.0f} {per:7.1f} "
                + " ".join(ratios)
            )
    return "\n".join(lines)


def main() -> int:
    p = arguments(__doc__)
    p.add_argument("--trees", default=f"main=/work/main,new={Path(__file__).resolve().parent.parent}")
    p.add_argument("--source", default="/usr/share")
    p.add_argument(
        "--rootfs", nargs="+", default=list(ROOTFS_TREES), help="host trees the tarball is made of"
    )
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--no-peers", action="store_true", help="casfs trees only (no bindfs, no floor)")
    args = p.parse_args()
    trees = dict(item.split("=", 1) for item in args.trees.split(","))
    # Each casfs tree after another peer, never after itself or another tree (its unmount
    # deletes its upper files, which taxes the creates of whatever runs next: see above);
    # the order rotates by two between repetitions.
    others = [] if args.no_peers else ["bindfs", "pyfuse3"]
    peers = [p for pair in itertools.zip_longest(others, trees) for p in pair if p is not None]
    stop_on_sigterm()
    with scratch(args.workdir, "casfs-dirops-", mounts=()) as work:
        report = run(args, work, trees, peers)
    heading = (
        f"{report['source']}: {report['entries']} entries; "
        f"rootfs tarball: {report['rootfs_entries']} entries; "
        f"median of {args.reps} interleaved runs; CPU = the daemon's user+system time; "
        f"load {os.getloadavg()[0]:.1f} at the end"
    )
    emit(report, args.json, heading, report_table(report, peers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
