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

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MIB = 1 << 20
CLI = [sys.executable, "-m", "casfs"]
_RAND = ["--rw=randread", "--bs=4k", "--direct=1", "--time_based"]
TESTS = {
    "seq cold": ["--rw=read", "--bs=1M", "--ioengine=psync"],
    # fio drops a file's page cache before it starts unless told not to
    "seq warm": ["--rw=read", "--bs=1M", "--ioengine=psync", "--invalidate=0"],
    "rand qd1": [*_RAND, "--ioengine=psync", "--iodepth=1"],
    "rand qd16": [*_RAND, "--ioengine=libaio", "--iodepth=16"],
}
PEERS = ("native", "bindfs", "casfs")


def generate(path: Path, size: int, seed: int = 7) -> None:
    rnd = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rnd.choices(letters, k=rnd.randint(2, 10))) for _ in range(5000)]
    lines = [(" ".join(rnd.choices(vocab, k=12)) + "\n").encode() for _ in range(50_000)]
    with open(path, "wb") as f:
        for i in range(size // MIB):
            kind = i % 8
            if kind == 0:
                f.write(bytes(MIB))
            elif kind < 5:
                f.write(rnd.randbytes(MIB))
            else:
                f.write(b"".join(rnd.choices(lines, k=MIB // 60))[:MIB].ljust(MIB, b"\n"))


def drop_caches() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def sh(*cmd: str | Path, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: {done.stderr.strip()}")
    return done.stdout


def is_mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


@contextlib.contextmanager
def bindfs(src: Path, mnt: Path) -> Iterator[Path]:
    mnt.mkdir(exist_ok=True)
    sh("bindfs", "-r", src, mnt)
    try:
        yield mnt
    finally:
        unmount(mnt)


def unmount(mnt: Path) -> None:
    for cmd in (["fusermount3", "-u", str(mnt)], ["fusermount3", "-u", "-z", str(mnt)]):
        if not is_mounted(mnt):
            return
        subprocess.run(cmd, capture_output=True, timeout=120)


class Casfs:
    """A whole-store casfs mount, remountable (for a cold chunk cache)."""

    def __init__(self, store: Path, mnt: Path, cache_mb: int | None) -> None:
        self.store, self.mnt = store, mnt
        self.env = dict(os.environ, CASFS_STORE=str(store))
        if cache_mb is not None:
            self.env["CASFS_CHUNK_CACHE_MB"] = str(cache_mb)
        mnt.mkdir(exist_ok=True)

    def mount(self) -> None:
        sh(*CLI, "mount", self.mnt, env=self.env, timeout=120)

    def umount(self) -> None:
        if is_mounted(self.mnt):
            cmd = [*CLI, "umount", str(self.mnt)]
            done = subprocess.run(cmd, capture_output=True, env=self.env, timeout=300)
            if done.returncode != 0:
                unmount(self.mnt)

    def pid(self) -> int | None:
        for run_file in (self.store / "run").glob("*.json"):
            record = json.loads(run_file.read_text())
            if record.get("mountpoint") == str(self.mnt) and record.get("state") == "mounted":
                return int(record["pid"])
        return None


def fio(path: Path, test: str, size: int, runtime: int) -> dict[str, float]:
    args = ["fio", "--name=bench", f"--filename={path}", "--readonly", f"--size={size}"]
    args += ["--output-format=json"]
    args += TESTS[test]
    if "--time_based" in args:
        args += [f"--runtime={runtime}", "--randrepeat=0"]
    out = json.loads(sh(*args, timeout=runtime + 600))
    read = out["jobs"][0]["read"]
    return {"mbps": read["bw_bytes"] / 1e6, "iops": read["iops"], "lat_us": read["clat_ns"]["mean"] / 1000}


def run(size: int, workdir: Path, runtime: int, chunk_size: int, cache_mb: int | None) -> dict[str, Any]:
    from casfs.images import import_image
    from casfs.repo import Repository

    native_dir = workdir / "native"
    native_dir.mkdir()
    image = native_dir / "disk.img"
    generate(image, size)
    repo = Repository.init(workdir / "store")
    t = time.perf_counter()
    import_image(repo, "disk", image, chunk_size=chunk_size)
    import_s = time.perf_counter() - t
    repo.close()
    results: dict[str, dict[str, dict[str, float]]] = {test: {} for test in TESTS}
    cas = Casfs(workdir / "store", workdir / "casfs", cache_mb)
    dropped = True
    with bindfs(native_dir, workdir / "bindfs") as bind:
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


def describe(test: str, r: dict[str, float]) -> str:
    return f"{r['mbps']:8.1f} MB/s" if test.startswith("seq") else f"{r['iops']:8.0f} IOPS"


def table(report: dict[str, Any]) -> str:
    rows = [f"{'test':10} {'native':>14} {'bindfs':>14} {'casfs':>14} {'vs native':>10} {'vs bindfs':>10}"]
    for test, by_peer in report["results"].items():
        key = "mbps" if test.startswith("seq") else "iops"
        unit = "MB/s" if key == "mbps" else "IOPS"
        cells = [f"{by_peer[p][key]:9.0f} {unit:4}" for p in PEERS]
        ratios = [by_peer["casfs"][key] / by_peer[p][key] for p in ("native", "bindfs")]
        line = f"{test:10} " + " ".join(f"{c:>14}" for c in cells)
        rows.append(line + "".join(f" {r:9.2f}x" for r in ratios))
    if not report["dropped_caches"]:
        rows.append("(could not drop the page cache: cold reads may have come from memory; run as root)")
    return "\n".join(rows)


def main() -> int:
    from casfs.units import parse_size

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--size", default="1G")
    p.add_argument("--workdir", default=os.environ.get("CASFS_BENCH_DIR", "/var/tmp"))
    p.add_argument("--runtime", type=int, default=15, help="seconds per random-read test")
    p.add_argument("--chunk-size", default="64K", help="the image's chunk size (default 64K)")
    p.add_argument("--cache-mb", type=int, default=None, help="the casfs daemon's chunk cache, MiB")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    size = parse_size(args.size)
    work = Path(tempfile.mkdtemp(prefix="casfs-readbench-", dir=args.workdir))
    try:
        report = run(size, work, args.runtime, parse_size(args.chunk_size), args.cache_mb)
    finally:
        for mnt in (work / "casfs", work / "bindfs"):
            unmount(mnt)
        if not any(is_mounted(work / m) for m in ("casfs", "bindfs")):
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        cache = f"{args.cache_mb} MiB" if args.cache_mb is not None else "default"
        print(
            f"{args.size} image, {args.chunk_size} chunks, chunk cache {cache}, {os.cpu_count()} CPUs, fio; "
            "casfs through images/disk of a store mount"
        )
        print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
