#!/usr/bin/env python3
"""Images and imports beside squashfuse, borg and restic, in one run.

    python benchmarks/image_bench.py [--tree /usr/share] [--size 1G] [--reps 2]
                                     [--squashfuse squashfuse] [--chunk-size 64K]
                                     [--workdir DIR] [--json]

Two sources under DIR/src: `tree`, a copy of --tree (default /usr/share, its entries
counted), and `disk.img`, a generated mixed image of --size (a third zeros, a third
random, a third text in 1 MiB runs, every run distinct: import_speed.py's). Each peer
takes both into one repository, timed, page cache dropped before each step:

  casfs       `casfs image import tree SRC/tree`, then `... disk SRC/disk.img` (a fresh store)
  restic      `restic backup` of each (a fresh repository; its defaults: encrypted, zstd auto)
  borg        `borg create` of each (a fresh repository, `-e none`; its defaults: lz4)
  squashfuse  `mksquashfs tree OUT -comp zstd -keep-as-directory`, then disk.img appended,
              then `sync OUT` (mksquashfs does not sync; the others do); in the last
              repetition only (zstd's level 15, mksquashfs's default, takes minutes)

Then the last repetition's repositories are mounted by each peer's daemon (casfs: the
whole-store mount, MNT/images/{tree,disk}; borg: `borg mount -f` of the repository;
restic: `restic mount`; squashfuse: `squashfuse -f`), one mount per peer per
repetition, each after dropping the page cache. casfs twice more, read-only (`--ro`)
with FUSE passthrough: pt-first with passthrough's file cache emptied (the image's first
reader: its open queues the background fill of the cache file, the daemon serves it
meanwhile), pt-cached once that fill is done (the kernel reads the cache file):

  seq read cold   dd bs=1M of the image file, MB/s, right after the mount
  ls -lR cold     ls -lR of the tree, right after (each daemon's first walk of it)
  ls -lR warm     ls -lR again (what the kernel and the daemon kept)
  seq read hot    dd bs=1M of the image file again (its pages cached), MB/s
  rand 4K cold    fio randread 4 KiB qd1 (psync) of the image file for 3 s after a drop
                  of the page cache, IOPS (the cache file keeps the image's zero runs
                  as holes, which the native file has written: not comparable there)
  rand 4K hot     the same again once a dd has read the whole file in, IOPS
  daemon RSS      VmHWM of the daemon after all of them, MiB

Repetitions interleave the peers (the order rotates each time); figures are medians.
Ratios are casfs over each peer (for seconds and MiB, above 1 is worse). Targets
(issue 8): seq read cold >= 1.0x squashfuse, ls -lR warm <= 1.0x squashfuse, RSS <=
borg's, tree import >= 1.0x restic, image import >= 1.5x borg; (issue 30) pt-cached seq
read cold and hot and rand 4K hot >= 0.8x native, pt-first seq read cold >= 1.0x
squashfuse. Run as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchlib import (
    CLI,
    MIB,
    NOT_DROPPED,
    Casfs,
    Row,
    arguments,
    drop_caches,
    emit,
    fio,
    generate,
    is_mounted,
    memory_kib,
    scratch,
    sh,
    stop_on_sigterm,
    table,
    unmount,
    wait_file_cache,
)

PEERS = ("native", "squashfuse", "borg", "restic", "casfs", "pt-first", "pt-cached")
ARCHIVERS = ("casfs", "restic", "borg", "squashfuse")
SOURCES = ("tree", "disk")
MOUNTED = ("native", "squashfuse", "borg", "restic", "casfs", "pt-first", "pt-cached")
READS = (
    "seq read cold",
    "ls -lR cold",
    "ls -lR warm",
    "seq read hot",
    "rand 4K cold",
    "rand 4K hot",
    "daemon peak RSS",
)
_RAND_4K = ["--rw=randread", "--bs=4k", "--ioengine=psync", "--invalidate=0", "--runtime=3", "--time_based"]


def _env(work: Path) -> dict[str, str]:
    return dict(
        os.environ,
        RESTIC_PASSWORD="bench",
        RESTIC_CACHE_DIR=str(work / "restic-cache"),
        BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes",
        BORG_RELOCATED_REPO_ACCESS_IS_OK="yes",
        BORG_BASE_DIR=str(work / "borg-base"),
    )


def _shell(
    cmd: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 1800
) -> tuple[float, str]:
    """Seconds a shell line takes, and its output; fails if the line does."""
    t = time.perf_counter()
    # Its own process group, so that an interruption stops the whole line (bash's
    # children too: a killed bash would leave mksquashfs running).
    with subprocess.Popen(
        ["bash", "-o", "pipefail", "-c", cmd],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd}: exit {proc.returncode}: {err.strip()[-2000:]}")
    return elapsed, out


def tree_bytes(top: Path) -> tuple[int, int]:
    """(entries, bytes of regular files, each inode once) under top, top included."""
    seen: set[tuple[int, int]] = set()
    entries, size = 1, 0
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            entries += 1
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_mode & 0o170000) == 0o100000 and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                size += st.st_size
    return entries, size


class Repos:
    """One repetition's repositories, one per archiver, each holding both sources."""

    def __init__(self, base: Path, src: Path, env: dict[str, str], chunk_size: str | None) -> None:
        self.base, self.src, self.env = base, src, env
        self.chunk_opt = f" --chunk-size {chunk_size}" if chunk_size else ""
        base.mkdir()
        self.store = base / "casfs-store"
        self.borg = base / "borg-repo"
        self.restic = base / "restic-repo"
        self.sqsh = base / "images.sqsh"
        self.restic_ids: dict[str, str] = {}
        self.cas = Casfs(self.store, base / "unused")
        self.cas.cli("init")
        sh("borg", "init", "-e", "none", self.borg, env=env)
        sh("restic", "init", "--repo", self.restic, env=env)

    def take(self, peer: str, source: str) -> float:
        """Import one source into the peer's repository; seconds."""
        path = "tree" if source == "tree" else "disk.img"
        if peer == "casfs":
            opt = self.chunk_opt if source == "disk" else ""
            cmd = f"{' '.join(CLI)} image import {source} '{self.src / path}'{opt}"
            return _shell(cmd, self.cas.env)[0]
        if peer == "borg":
            return _shell(f"borg create '{self.borg}::{source}' {path}", self.env, cwd=self.src)[0]
        if peer == "restic":
            secs, out = _shell(f"restic backup --json --repo '{self.restic}' '{self.src / path}'", self.env)
            summary = [json.loads(x) for x in out.splitlines() if '"summary"' in x]
            self.restic_ids[source] = summary[-1]["snapshot_id"]
            return secs
        first = source == "tree"
        opts = "-comp zstd -noappend -keep-as-directory" if first else ""
        cmd = f"mksquashfs {path} '{self.sqsh}' {opts} -quiet -no-progress && sync '{self.sqsh}'"
        return _shell(cmd, self.env, cwd=self.src)[0]


class Daemon:
    """A FUSE daemon run in the foreground by us: its pid is the Popen's."""

    def __init__(self, argv: list[str], mnt: Path, env: dict[str, str]) -> None:
        self.argv, self.mnt, self.env = argv, mnt, env
        self.proc: subprocess.Popen[bytes] | None = None

    def mount(self, timeout: float = 120) -> None:
        self.mnt.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while not is_mounted(self.mnt):
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"{self.argv[0]} exited {self.proc.returncode}: {err.strip()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.argv[0]}: not mounted after {timeout} s")
            time.sleep(0.05)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        """Unmount, then wait for the daemon; killed (by its pid) if it lingers."""
        unmount(self.mnt)
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        finally:
            if proc.stderr is not None:
                proc.stderr.close()


@contextlib.contextmanager
def served(peer: str, repos: Repos, mnt: Path, squashfuse: str) -> Iterator[tuple[Path, Path, int | None]]:
    """The peer's daemon serving both sources: (image file, tree dir, daemon pid)."""
    if peer == "native":
        yield repos.src / "disk.img", repos.src / "tree", None
        return
    if peer in ("casfs", "pt-first", "pt-cached"):
        cas = Casfs(repos.store, mnt, args=("--ro",) if peer != "casfs" else ())
        mnt.mkdir(exist_ok=True)
        if peer == "pt-first":
            sh("rm", "-rf", repos.store / "cache" / "files")
        with cas.mounted():
            if peer == "pt-cached":
                with open(mnt / "images" / "disk", "rb") as f:  # (queues the fill, if not done)
                    f.read(4096)
                wait_file_cache(mnt)
                drop_caches()
            yield mnt / "images" / "disk", mnt / "images" / "tree", cas.pid()
            if peer == "pt-first":
                wait_file_cache(mnt)  # (not timed: what the first reader left running)
        return
    if peer == "squashfuse":
        argv = [squashfuse, "-f", str(repos.sqsh), str(mnt)]
        paths = (mnt / "disk.img", mnt / "tree")
    elif peer == "borg":
        argv = ["borg", "mount", "-f", str(repos.borg), str(mnt)]
        paths = (mnt / "disk" / "disk.img", mnt / "tree" / "tree")
    else:
        argv = ["restic", "mount", "--repo", str(repos.restic), "--path-template", "ids/%i", str(mnt)]
        src = str(repos.src).lstrip("/")
        paths = (
            mnt / "ids" / repos.restic_ids["disk"] / src / "disk.img",
            mnt / "ids" / repos.restic_ids["tree"] / src / "tree",
        )
    daemon = Daemon(argv, mnt, repos.env)
    try:
        daemon.mount()
        yield paths[0], paths[1], daemon.pid
    finally:
        daemon.stop()


def read_once(
    peer: str, repos: Repos, mnt: Path, squashfuse: str, size: int
) -> tuple[dict[str, float], bool]:
    dropped = drop_caches()
    with served(peer, repos, mnt, squashfuse) as (disk, tree, pid):
        secs, _ = _shell(f"dd if='{disk}' of=/dev/null bs=1M", repos.env)
        figures = {"seq read cold": size / secs / 1e6}
        figures["ls -lR cold"] = _shell(f"ls -lR '{tree}' > /dev/null", repos.env)[0]
        figures["ls -lR warm"] = _shell(f"ls -lR '{tree}' > /dev/null", repos.env)[0]
        figures["seq read hot"] = size / _shell(f"dd if='{disk}' of=/dev/null bs=1M", repos.env)[0] / 1e6
        dropped = drop_caches() and dropped
        figures["rand 4K cold"] = float(fio(disk, _RAND_4K, size)["iops"])
        _shell(f"dd if='{disk}' of=/dev/null bs=1M", repos.env)  # (every page in, for the hot run)
        figures["rand 4K hot"] = float(fio(disk, _RAND_4K, size)["iops"])
        hwm = memory_kib(pid).get("VmHWM")
        if hwm is not None:
            figures["daemon peak RSS"] = hwm / 1024
    return figures, dropped


def run(
    tree: Path, size: int, reps: int, work: Path, squashfuse: str, chunk_size: str | None = None
) -> dict[str, Any]:
    env = _env(work)
    src = work / "src"
    src.mkdir()
    print(f"copying {tree} and generating a {size // MIB} MiB image …", file=sys.stderr)
    sh("cp", "-a", tree, src / "tree", timeout=1800)
    generate(src / "disk.img", size, seed=1, runs="zrt")
    entries, tree_size = tree_bytes(src / "tree")
    sizes = {"tree": tree_size, "disk": size}
    imports: dict[str, dict[str, list[float]]] = {s: {p: [] for p in ARCHIVERS} for s in SOURCES}
    reads: dict[str, dict[str, list[float]]] = {t: {p: [] for p in MOUNTED} for t in READS}
    dropped = True
    repos: Repos | None = None
    mnt = work / "mnt"
    try:
        for rep in range(reps):
            if repos is not None:
                sh("rm", "-rf", repos.base)
            repos = Repos(work / f"rep{rep}", src, env, chunk_size)
            order = ARCHIVERS[rep % len(ARCHIVERS) :] + ARCHIVERS[: rep % len(ARCHIVERS)]
            for source in SOURCES:
                for peer in order:
                    if peer == "squashfuse" and rep != reps - 1:
                        continue  # mksquashfs at zstd's level 15 takes minutes: once is enough
                    dropped = drop_caches() and dropped
                    secs = repos.take(peer, source)
                    imports[source][peer].append(sizes[source] / secs / 1e6)
                    print(f"  rep {rep} import {source:5} {peer:10} {secs:7.2f} s", file=sys.stderr)
        assert repos is not None
        for rep in range(reps):
            order = MOUNTED[rep % len(MOUNTED) :] + MOUNTED[: rep % len(MOUNTED)]
            for peer in order:
                figures, ok = read_once(peer, repos, mnt, squashfuse, size)
                dropped = dropped and ok
                for test, value in figures.items():
                    reads[test][peer].append(value)
                shown = ", ".join(f"{k} {v:.2f}" for k, v in figures.items())
                print(f"  rep {rep} mount {peer:10} {shown}", file=sys.stderr)
    finally:
        unmount(mnt)
    medians: dict[str, dict[str, float]] = {}
    for source, by_peer in imports.items():
        medians[f"import {source}"] = {p: statistics.median(v) for p, v in by_peer.items() if v}
    for test, by_peer in reads.items():
        medians[test] = {p: statistics.median(v) for p, v in by_peer.items() if v}
    return {
        "tree": str(tree),
        "entries": entries,
        "tree_bytes": tree_size,
        "size": size,
        "reps": reps,
        "squashfuse": squashfuse,
        "chunk_size": chunk_size,
        "casfs": os.environ.get("PYTHONPATH", ""),
        "dropped_caches": dropped,
        "cpus": os.cpu_count(),
        "samples": {"imports": imports, "reads": reads},
        "medians": medians,
    }


UNITS = {
    "import tree": ("MB/s", True),
    "import disk": ("MB/s", True),
    "seq read cold": ("MB/s", True),
    "ls -lR cold": ("s", False),
    "ls -lR warm": ("s", False),
    "seq read hot": ("MB/s", True),
    "rand 4K cold": ("IOPS", True),
    "rand 4K hot": ("IOPS", True),
    "daemon peak RSS": ("MiB", False),
}
# (row, subject, peer, bound, higher is better)
TARGETS = (
    ("seq read cold", "casfs", "squashfuse", 1.0, True),
    ("ls -lR warm", "casfs", "squashfuse", 1.0, False),
    ("daemon peak RSS", "casfs", "borg", 1.0, False),
    ("import tree", "casfs", "restic", 1.0, True),
    ("import disk", "casfs", "borg", 1.5, True),
    ("seq read cold", "pt-first", "squashfuse", 1.0, True),
    ("seq read cold", "pt-cached", "native", 0.8, True),
    ("seq read hot", "pt-cached", "native", 0.8, True),
    ("rand 4K hot", "pt-cached", "native", 0.8, True),
)


def verdicts(medians: dict[str, dict[str, float]]) -> list[str]:
    out = []
    for test, subject, peer, bound, higher in TARGETS:
        have, other = medians.get(test, {}).get(subject), medians.get(test, {}).get(peer)
        if have is None or not other:
            continue
        ratio = have / other
        met = ratio >= bound if higher else ratio <= bound
        sign = ">=" if higher else "<="
        verdict = "met" if met else "MISSED"
        out.append(f"  {test:16} {subject}/{peer} {ratio:5.2f}x (target {sign} {bound}x): {verdict}")
    return out


def report_text(report: dict[str, Any]) -> list[str]:
    rows = [Row(t, UNITS[t][0], v, UNITS[t][1]) for t, v in report["medians"].items()]
    heading = (
        f"{report['tree']} copy: {report['entries']} entries, {report['tree_bytes'] / 1e6:.0f} MB; "
        f"{report['size'] // MIB} MiB mixed image; {report['cpus']} CPUs; median of {report['reps']} "
        f"interleaved runs; import rows: squashfuse = mksquashfs -comp zstd, native = -"
    )
    lines = [heading, table(rows, PEERS, ("squashfuse", "borg", "restic", "native")), "targets:"]
    lines += verdicts(report["medians"])
    if not report["dropped_caches"]:
        lines.append(NOT_DROPPED)
    return lines


def main() -> int:
    from casfs.units import parse_size

    stop_on_sigterm()
    p = arguments(__doc__)
    p.add_argument("--tree", default="/usr/share", help="the directory tree copied and imported")
    p.add_argument("--size", default="1G", help="size of the generated mixed image (default 1G)")
    p.add_argument("--reps", type=int, default=2, help="interleaved repetitions (default 2)")
    p.add_argument("--squashfuse", default="squashfuse", help="squashfuse or squashfuse_ll")
    p.add_argument("--chunk-size", default=None, help="casfs's chunk size for the image (default: casfs's)")
    args = p.parse_args()
    with scratch(args.workdir, "casfs-imagebench-", mounts=("mnt",)) as work:
        report = run(
            Path(args.tree), parse_size(args.size), args.reps, work, args.squashfuse, args.chunk_size
        )
    emit(report, args.json, *report_text(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
