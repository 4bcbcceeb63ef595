"""What the benchmarks share: generated images, commands with timeouts, mounts that are
always undone (bindfs and casfs), the page cache, fio, timings, the daemon's memory, the
table and the output.

Not a test helper: the scripts run as root on a disk-backed --workdir, and print
casfs's figure next to the native filesystem's and bindfs's (a C FUSE passthrough)
from the same run, with the ratios casfs/native and casfs/bindfs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from casfs.fuse.mountinfo import find_mount

CLI = [sys.executable, "-m", "casfs"]
PEERS = ("native", "bindfs", "casfs")
MIB = 1 << 20
# Host trees about the size of a debian:bookworm root filesystem (oci_bench's image,
# dir_bench's tarball).
ROOTFS_TREES = ("/etc", "/usr/lib/python3.11", "/usr/lib/python3", "/usr/share/perl", "/usr/share/zoneinfo")
NOT_DROPPED = "(could not drop the page cache: cold reads may have come from memory; run as root)"


def generate(path: Path, size: int, seed: int, runs: str) -> None:
    """An image of distinct 1 MiB runs, the i-th of the kind runs[i % len(runs)]: z for
    zeros, r for random bytes, t for text (what compresses and what does not)."""
    rnd = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rnd.choices(letters, k=rnd.randint(2, 10))) for _ in range(5000)]
    lines = [(" ".join(rnd.choices(vocab, k=12)) + "\n").encode() for _ in range(50_000)]
    with open(path, "wb") as f:
        for i in range(size // MIB):
            kind = runs[i % len(runs)]
            if kind == "z":
                f.write(bytes(MIB))
            elif kind == "r":
                f.write(rnd.randbytes(MIB))
            else:
                f.write(b"".join(rnd.choices(lines, k=MIB // 60))[:MIB].ljust(MIB, b"\n"))


def sh(*cmd: str | Path, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    """A command's output; it fails if the command does. Interrupted or timed out, the
    command is killed and waited for (subprocess.run waits a quarter of a second after
    Ctrl-C: an fio still in I/O would keep the mount busy for the unmount after it)."""
    args = [str(c) for c in cmd]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {proc.returncode}: {err.strip()}")
    return out


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


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int | None, thread: int | None = None) -> tuple[float, float]:
    """(user, system) seconds a process (or one of its threads) has used."""
    if pid is None:
        return 0.0, 0.0
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def is_mounted(path: Path) -> bool:
    """Anything mounted at `path` (casfs, bindfs, a qsd export), without touching it."""
    return find_mount(str(path)) is not None


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


def stop_on_sigterm() -> None:
    """SIGTERM (a kill by pid) stops the script as Ctrl-C does: KeyboardInterrupt, so the
    finally blocks unmount and stop every daemon before it exits."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


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
def bindfs(src: Path, mnt: Path, read_only: bool = False) -> Iterator[Path]:
    """bindfs as it comes (single-threaded; read/write unless `read_only`)."""
    mnt.mkdir(exist_ok=True)
    sh("bindfs", *(["-r"] if read_only else []), src, mnt, timeout=60)
    try:
        yield mnt
    finally:
        unmount(mnt)


class Casfs:
    """A casfs mount through the CLI (background daemon), remountable, with the daemon's
    pid for memory figures and profiles."""

    def __init__(
        self,
        store: Path,
        mnt: Path,
        volume: str | None = None,
        cache_mb: int | None = None,
        args: Sequence[str] = (),  # more `casfs mount` options (--ro, --no-passthrough)
    ) -> None:
        self.store, self.mnt, self.volume, self.args = store, mnt, volume, tuple(args)
        self.env = dict(os.environ, CASFS_STORE=str(store))
        if cache_mb is not None:
            self.env["CASFS_CHUNK_CACHE_MB"] = str(cache_mb)

    def cli(self, *args: str | Path, timeout: float = 600) -> str:
        return sh(*CLI, *args, env=self.env, timeout=timeout)

    def mount(self) -> None:
        try:
            volume = ["--volume", self.volume] if self.volume else []
            self.cli("mount", self.mnt, *volume, *self.args, timeout=120)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            self._settle()
            raise

    def _settle(self, timeout: float = 30) -> None:
        """After `casfs mount` was cut short: its daemon, already started, serves on
        without its launcher; wait for its mount and undo it, so that nothing is left
        serving the work directory when it is removed."""
        deadline = time.monotonic() + timeout
        while not is_mounted(self.mnt) and time.monotonic() < deadline:
            time.sleep(0.1)
        unmount(self.mnt)

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
    """One fio job on `path`; its read and write figures (MB/s, IOPS, mean latency, bytes)."""
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
                "bytes": part["io_bytes"],
            }
    # Whole-job wall time (seq write + end_fsync: the fsync is in it, bw_bytes is not)
    runtime_ms = max(job["read"]["runtime"], job["write"]["runtime"]) or job.get("job_runtime", 0)
    figures["runtime_s"] = runtime_ms / 1000
    return figures


def describe(test: str, figures: dict[str, float]) -> str:
    """One fio figure: MB/s for a sequential test, IOPS for a random one."""
    return f"{figures['mbps']:8.1f} MB/s" if test.startswith("seq") else f"{figures['iops']:8.0f} IOPS"


def fio_rows(results: dict[str, dict[str, dict[str, float]]]) -> list[Row]:
    """Table rows of fio figures by test and peer (MB/s or IOPS, as describe())."""
    rows = []
    for test, by_peer in results.items():
        key, unit = ("mbps", "MB/s") if test.startswith("seq") else ("iops", "IOPS")
        rows.append(Row(test, unit, {p: v[key] for p, v in by_peer.items()}))
    return rows


def median_ms(fn: Any, runs: int, before: Any = None) -> float:
    """Median milliseconds of fn(i) over `runs`, each after before(i) (untimed) if given.
    (Any: callers bind loop variables as lambda defaults, which mypy cannot type.)"""
    times = []
    for i in range(runs):
        if before is not None:
            before(i)
        t = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def emit(report: object, as_json: bool, *text: str) -> None:
    """A script's output: the report as JSON, or `text` (a heading, a table) for people."""
    print(json.dumps(report, indent=2) if as_json else "\n".join(text))


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


def wait_file_cache(mnt: Path, timeout: float = 1800) -> float:
    """Seconds until passthrough's background fills on the mount at `mnt` are done (none
    queued, none in flight: `user.casfs.file_cache`); its status line is printed."""
    t = time.perf_counter()
    while True:
        status = os.getxattr(mnt, "user.casfs.file_cache").decode()
        fills = status.split("background fills: ")[-1]
        if ", 0 queued" in fills and "filling" not in fills:
            print(f"  file cache: {status}", file=sys.stderr)
            return time.perf_counter() - t
        if time.perf_counter() - t > timeout:
            raise TimeoutError(f"the file cache's fills did not end in {timeout:.0f} s: {status}")
        time.sleep(0.05)
