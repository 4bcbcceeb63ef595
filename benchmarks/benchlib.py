"""What the side-by-side benchmarks share: commands with timeouts, mounts that are always
undone (bindfs and casfs), the page cache, fio, the daemon's memory, and the table.

Not a test helper: the scripts run as root on a disk-backed --workdir, and print
casfs's figure next to the native filesystem's and bindfs's (a C FUSE passthrough)
from the same run, with the ratios casfs/native and casfs/bindfs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "casfs"]
PEERS = ("native", "bindfs", "casfs")


def sh(*cmd: str | Path, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def timed(cmd: str, cwd: Path | None = None, timeout: float = 600) -> float:
    """Seconds a shell line takes (its output discarded); fails if the line does."""
    t = time.perf_counter()
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, capture_output=True, timeout=timeout
    )
    elapsed = time.perf_counter() - t
    if done.returncode != 0:
        raise RuntimeError(f"{cmd}: exit {done.returncode}: {done.stderr.decode(errors='replace').strip()}")
    return elapsed


def drop_caches() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def is_mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


def unmount(path: Path) -> None:
    for cmd in (["fusermount3", "-u", str(path)], ["fusermount3", "-u", "-z", str(path)]):
        if not is_mounted(path):
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(cmd, capture_output=True, timeout=120)


def arguments(description: str | None) -> argparse.ArgumentParser:
    """A script's parser with the options every benchmark takes (--workdir, --json)."""
    p = argparse.ArgumentParser(description=description.splitlines()[0] if description else None)
    p.add_argument("--workdir", default=os.environ.get("CASFS_BENCH_DIR", "/var/tmp"))
    p.add_argument("--json", action="store_true")
    return p


@contextlib.contextmanager
def scratch(parent: str, prefix: str, mounts: Sequence[str] = ("casfs", "bindfs")) -> Iterator[Path]:
    """A work directory under `parent`, removed afterwards unless one of its `mounts`
    could not be unmounted (never delete through a live mount)."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield work
    finally:
        for mnt in mounts:
            unmount(work / mnt)
        if not any(is_mounted(work / m) for m in mounts):
            shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def bindfs(src: Path, mnt: Path) -> Iterator[Path]:
    """bindfs as it comes (single-threaded; read/write)."""
    mnt.mkdir(exist_ok=True)
    sh("bindfs", src, mnt, timeout=60)
    try:
        yield mnt
    finally:
        unmount(mnt)


class Casfs:
    """A casfs mount through the CLI (background daemon), remountable, with the daemon's
    pid for memory figures and profiles."""

    def __init__(
        self, store: Path, mnt: Path, volume: str | None = None, cache_mb: int | None = None
    ) -> None:
        self.store, self.mnt, self.volume = store, mnt, volume
        self.env = dict(os.environ, CASFS_STORE=str(store))
        if cache_mb is not None:
            self.env["CASFS_CHUNK_CACHE_MB"] = str(cache_mb)

    def cli(self, *args: str | Path, timeout: float = 600) -> str:
        return sh(*CLI, *args, env=self.env, timeout=timeout)

    def mount(self) -> None:
        self.cli("mount", self.mnt, *(["--volume", self.volume] if self.volume else []), timeout=120)

    def umount(self) -> str:
        """`casfs umount` (flush, snapshot, exit); its output (the snapshots taken)."""
        if not is_mounted(self.mnt):
            return ""
        cmd = [*CLI, "umount", str(self.mnt)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=600)
        if done.returncode != 0:
            unmount(self.mnt)
            raise RuntimeError(f"casfs umount {self.mnt}: {done.stderr.strip()}")
        return done.stdout

    def pid(self) -> int | None:
        for run_file in (self.store / "run").glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                record = json.loads(run_file.read_text())
                if record.get("mountpoint") == str(self.mnt) and record.get("state") == "mounted":
                    return int(record["pid"])
        return None

    @contextlib.contextmanager
    def mounted(self) -> Iterator[Path]:
        self.mount()
        try:
            yield self.mnt
        finally:
            with contextlib.suppress(RuntimeError):
                self.umount()
            unmount(self.mnt)


def memory_kib(pid: int | None) -> dict[str, int]:
    """VmHWM (peak resident) and VmRSS of a process, KiB."""
    out: dict[str, int] = {}
    if pid is None:
        return out
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0])
    return out


def fio(path: Path, args: Sequence[str], size: int, timeout: float = 900) -> dict[str, Any]:
    """One fio job on `path`; its read and write figures (MB/s, IOPS, mean latency)."""
    cmd = ["fio", "--name=bench", f"--filename={path}", f"--size={size}", "--output-format=json", *args]
    out = json.loads(sh(*cmd, timeout=timeout))
    job = out["jobs"][0]
    figures: dict[str, Any] = {}
    for side in ("read", "write"):
        part = job[side]
        if part["io_bytes"]:
            figures = {
                "mbps": part["bw_bytes"] / 1e6,
                "iops": part["iops"],
                "lat_us": part["clat_ns"]["mean"] / 1000,
            }
    # Whole-job wall time (seq write + end_fsync: the fsync is in it, bw_bytes is not)
    runtime_ms = max(job["read"]["runtime"], job["write"]["runtime"]) or job.get("job_runtime", 0)
    figures["runtime_s"] = runtime_ms / 1000
    return figures


def median_ms(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


@dataclass
class Row:
    test: str
    unit: str
    values: dict[str, float]  # peer -> figure
    higher_is_better: bool = True


def table(
    rows: Sequence[Row], peers: Sequence[str] = PEERS, bases: Sequence[str] = ("native", "bindfs")
) -> str:
    """Rows of figures with the ratios casfs/base for each of `bases` (for times, a
    ratio above 1 is slower; for rates, below 1 is slower)."""
    head = f"{'test':24} " + " ".join(f"{p:>12}" for p in peers) + f" {'unit':6} "
    head += " ".join(f"{'/' + b:>10}" for b in bases)
    lines = [head]
    for r in rows:
        cells = " ".join(f"{_fmt(r.values.get(p)):>12}" for p in peers)
        ratios = []
        for base in bases:
            have, other = r.values.get("casfs"), r.values.get(base)
            ratios.append(f"{have / other:9.2f}x" if have is not None and other else f"{'-':>10}")
        lines.append(f"{r.test:24} {cells} {r.unit:6} " + " ".join(ratios))
    return "\n".join(lines)


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}"
