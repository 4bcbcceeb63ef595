#!/usr/bin/env python3
"""create + fsync in one growing directory, beside the native filesystem and bindfs
(a C FUSE passthrough), in one run: the rate must not fall as the directory grows.

    python benchmarks/dir_fsync.py [--sizes 100,1000,5000,20000] [--batch 200] [--workdir DIR] [--json]

Each peer gets one directory. It is grown (creates without fsync, untimed, then one
fsync) to each size in turn; at each size, `--batch` files are created, written (100
bytes) and fsync'd one by one, timed: files per second. casfs is a blank directory
volume mounted alone (`casfs mount MNT --volume v`). A flush of a changed directory
once rewrote its whole listing, so the rate fell with the directory's size; it writes
the changed entries only (issue 7, defect 11). Run as root.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import PEERS, Casfs, Row, arguments, emit, scratch, sh, table, unmount


def grow(d: Path, have: int, want: int) -> None:
    for i in range(have, want):
        with open(d / f"fill{i:06}", "wb"):
            pass
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_fsync_rate(d: Path, tag: str, batch: int) -> float:
    payload = b"x" * 100
    t = time.perf_counter()
    for i in range(batch):
        fd = os.open(d / f"{tag}-{i:05}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
    return batch / (time.perf_counter() - t)


def run(work: Path, sizes: list[int], batch: int) -> dict[str, dict[str, float]]:
    native, bind_src, bind_mnt = work / "native", work / "bindfs-src", work / "bindfs"
    cas = Casfs(work / "store", work / "casfs", volume="v")
    for d in (native, bind_src, bind_mnt, cas.mnt):
        d.mkdir()
    cas.cli("init")
    cas.cli("volume", "create", "v", "--blank-dir")
    rates: dict[str, dict[str, float]] = {str(n): {} for n in sizes}
    try:
        sh("bindfs", bind_src, bind_mnt, timeout=60)
        cas.mount()
        tops = {"native": native, "bindfs": bind_mnt, "casfs": cas.mnt}
        for peer in PEERS:
            d = tops[peer] / "d"
            d.mkdir()
            have = 0
            for n in sizes:
                grow(d, have, n)
                have = n + batch  # the timed files stay: the next size counts them
                rates[str(n)][peer] = create_fsync_rate(d, f"at{n}", batch)
                rate = rates[str(n)][peer]
                print(f"  {peer:7} {n:6} entries  {rate:8.0f} creates+fsync/s", file=sys.stderr)
    finally:
        unmount(bind_mnt)
        cas.umount()
        unmount(cas.mnt)
    return rates


def main() -> int:
    p = arguments(__doc__)
    p.add_argument("--sizes", default="100,1000,5000,20000")
    p.add_argument("--batch", type=int, default=200)
    args = p.parse_args()
    with scratch(args.workdir, "casfs-dirfsync-") as work:
        rates = run(work, [int(s) for s in args.sizes.split(",")], args.batch)
    report: dict[str, Any] = {"batch": args.batch, "rates": rates}
    emit(
        report,
        args.json,
        f"create + 100 B write + fsync, {args.batch} files per size, {os.cpu_count()} CPUs",
        table([Row(f"at {n} entries", "/s", by_peer) for n, by_peer in rates.items()]),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
