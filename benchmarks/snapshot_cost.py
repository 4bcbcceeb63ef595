#!/usr/bin/env python3
"""Clone and snapshot time against a block volume's size (it must stay flat), beside
the native filesystem, bindfs and qcow2, in one run.

    python benchmarks/snapshot_cost.py [--sizes 1M,1G,10G] [--runs 10] [--workdir DIR] [--json]

For each size: a blank block volume (`casfs volume create --blank-block`), mounted on
a file, given a few 4 KiB writes spread over it and unmounted (snapshot 1, so its map
is a real map, not only holes). Then, median of --runs, in ms:

  clone            casfs: `casfs volume create NEW --from VOL@1`, as a library call
                   (casfs.volumes.create_volume) and as the CLI (a Python process start
                   included); native: `cp --sparse=always` of a raw file of the same size
                   with the same writes; bindfs: the same cp through a bindfs mount;
                   qcow2: `qemu-img create -f qcow2 -b BASE` (an overlay)
  snapshot, rest   casfs: `casfs snapshot create VOL` (library call and CLI); qcow2:
                   `qemu-img snapshot -c` (an internal snapshot); the native file
                   system and bindfs have none
  snapshot, mounted  casfs: setxattr(user.casfs.snapshot) on the mounted block file
                   right after a 4 KiB write without fsync (the call syncs, flushes
                   and folds), issued in-process (setfattr(1) makes the same call)

Each figure comes with the ratio largest/smallest size. Run as root (mounts).
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

from benchlib import Casfs, arguments, bindfs, emit, median_ms, scratch, sh

WRITES = 8
KIB = 1 << 10


def spots(size: int) -> list[int]:
    """WRITES 4 KiB-aligned offsets spread over the disk."""
    step = max(4 * KIB, size // WRITES)
    return [min(i * step, size - 4 * KIB) // (4 * KIB) * (4 * KIB) for i in range(WRITES)]


def write_spots(path: Path, size: int, rnd: random.Random) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        for off in spots(size):
            os.pwrite(fd, rnd.randbytes(4 * KIB), off)
        os.fsync(fd)
    finally:
        os.close(fd)


def run(sizes: list[int], runs: int, work: Path) -> dict[str, dict[str, float]]:
    from casfs import volumes
    from casfs.repo import Repository

    rnd = random.Random(11)
    store = work / "store"
    cas = Casfs(store, work / "unused")
    cas.cli("init")
    native = work / "native"
    native.mkdir()
    results: dict[str, dict[str, float]] = {}

    def put(op: str, size: int, ms: float) -> None:
        results.setdefault(op, {})[str(size)] = ms
        print(f"  {op:28} {size:>12} {ms:9.2f} ms", file=sys.stderr)

    # Set up every size first.
    for size in sizes:
        vol = f"b{size}"
        cas.cli("volume", "create", vol, "--blank-block", str(size))
        m = Casfs(store, work / f"{vol}.img", volume=vol)
        m.mnt.touch()
        with m.mounted() as path:
            write_spots(path, size, rnd)
        raw = native / f"{vol}.raw"
        with open(raw, "wb") as f:
            f.truncate(size)
        write_spots(raw, size, rnd)
        qcow = work / f"{vol}.qcow2"
        sh("qemu-img", "create", "-q", "-f", "qcow2", qcow, str(size))
        io = [c for off in spots(size) for c in ("-c", f"write -P 0x5a {off} 4k")]
        sh("qemu-io", "-f", "qcow2", *io, qcow)

    repo = Repository.open(store)
    try:
        with bindfs(native, work / "bindfs") as bind:
            for size in sizes:
                vol = f"b{size}"
                raw = native / f"{vol}.raw"
                qcow = work / f"{vol}.qcow2"
                clone_src = f"{vol}@1"

                put(
                    "clone casfs (library)",
                    size,
                    median_ms(
                        lambda i, v=vol, s=clone_src: volumes.create_volume(
                            repo, f"{v}-lib{i}", volumes.Source(snapshot=s)
                        ),
                        runs,
                    ),
                )
                put(
                    "clone casfs (CLI)",
                    size,
                    median_ms(
                        lambda i, v=vol, s=clone_src: cas.cli("volume", "create", f"{v}-cli{i}", "--from", s),
                        runs,
                    ),
                )

                def cp(src: Path, dst: Path) -> None:
                    sh("cp", "--sparse=always", src, dst)
                    dst.unlink()

                put(
                    "clone native (cp)",
                    size,
                    median_ms(lambda i, r=raw: cp(r, native / f"copy{i}.raw"), runs),
                )
                put(
                    "clone bindfs (cp)",
                    size,
                    median_ms(lambda i, v=vol: cp(bind / f"{v}.raw", bind / f"copy{i}.raw"), runs),
                )
                put(
                    "clone qcow2 (overlay)",
                    size,
                    median_ms(
                        lambda i, q=qcow: sh(
                            "qemu-img",
                            "create",
                            "-q",
                            "-f",
                            "qcow2",
                            "-b",
                            q,
                            "-F",
                            "qcow2",
                            work / f"overlay{i}.qcow2",
                        ),
                        runs,
                    ),
                )
                put(
                    "snapshot casfs rest (library)",
                    size,
                    median_ms(lambda i, v=vol: volumes.create_snapshot(repo, v), runs),
                )
                put(
                    "snapshot casfs rest (CLI)",
                    size,
                    median_ms(lambda i, v=vol: cas.cli("snapshot", "create", v), runs),
                )
                put(
                    "snapshot qcow2 (internal)",
                    size,
                    median_ms(lambda i, q=qcow: sh("qemu-img", "snapshot", "-c", f"s{i}", q), runs),
                )
                for i in range(runs):
                    (work / f"overlay{i}.qcow2").unlink(missing_ok=True)

                m = Casfs(store, work / f"{vol}.img", volume=vol)
                with m.mounted() as path:
                    fd = os.open(path, os.O_RDWR)
                    try:

                        def dirty(i: int, fd: int = fd, size: int = size) -> None:
                            os.pwrite(fd, rnd.randbytes(4 * KIB), rnd.randrange(size // (4 * KIB)) * 4 * KIB)

                        put(
                            "snapshot casfs mounted (xattr)",
                            size,
                            median_ms(
                                lambda i, p=path: os.setxattr(p, "user.casfs.snapshot", b""),
                                runs,
                                before=dirty,
                            ),
                        )
                    finally:
                        os.close(fd)
    finally:
        repo.close()
    return results


def table(results: dict[str, dict[str, float]], sizes: list[int]) -> str:
    from casfs.units import format_size

    head = (
        f"{'operation (median ms)':32}"
        + "".join(f"{format_size(s):>12}" for s in sizes)
        + f"{'large/small':>13}"
    )
    lines = [head]
    for op, by_size in results.items():
        cells = "".join(f"{by_size[str(s)]:12.2f}" for s in sizes)
        ratio = by_size[str(sizes[-1])] / by_size[str(sizes[0])]
        lines.append(f"{op:32}{cells}{ratio:12.2f}x")
    return "\n".join(lines)


def main() -> int:
    from casfs.units import parse_size

    p = arguments(__doc__)
    p.add_argument("--sizes", default="1M,1G,10G")
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    mounts = ["bindfs", *(f"b{s}.img" for s in sizes)]
    with scratch(args.workdir, "casfs-snapcost-", mounts=mounts) as work:
        results = run(sizes, args.runs, work)
    emit(
        {"sizes": sizes, "runs": args.runs, "results": results},
        args.json,
        f"median of {args.runs} runs, block volumes with {WRITES} 4 KiB writes, {os.cpu_count()} CPUs",
        table(results, sizes),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
