#!/usr/bin/env python3
"""Replicating a block volume over ssh: `casfs pull` beside `rsync -a --inplace` of the
raw image, through the same ssh to a throwaway sshd on 127.0.0.1.

    python benchmarks/replica_bench.py [--size 1G] [--change 10M] [--change-data random|text]
                                       [--reuse-ssh] [--reps 3] [--workdir DIR] [--json]

One image of --size (a third zeros, a third random, a third text: benchlib.generate) is
imported into store A, a volume made from it and snapshotted (vm1@1). Then, each
repetition into a fresh store B and a fresh copy target:

  full          `casfs pull ssh://…/A vm1` into an empty store B, beside `rsync -a
                --inplace` of the raw image to a path where it does not exist yet
  incremental   --change bytes written into A's volume in 64 KiB pieces at random
                offsets (the same bytes at the same offsets into the raw image), the
                volume unmounted (vm1@2), then `casfs pull` again, beside rsync of the
                changed image onto the previous copy (its delta algorithm). The change
                is random bytes (incompressible: no transfer can move less than it) or,
                with --change-data text, text (what a package upgrade writes, roughly)

With --reuse-ssh both go through one persistent ssh connection (ControlMaster), so
neither pays the ssh handshake per run (on a loaded 2-core machine, most of a second).

Time is the command's wall time; bytes are what crossed ssh towards the receiver (casfs:
the bytes read from ssh's stdout, `pull --json`; rsync: "Total bytes received" of
--stats). The ratios are rsync over casfs: above 1, casfs is faster or moves less.
Medians over --reps. sshd and rsync: scripts/install.sh installs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchlib import CLI, arguments, emit, generate, scratch, sh, stop_on_sigterm

from casfs.ids import ROOT_INO
from casfs.repo import Repository
from casfs.units import format_size, parse_size
from casfs.vfs.volume import open_volume

CHUNK = 64 << 10
ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def sshd(work: Path, reuse: bool = False) -> Iterator[tuple[str, int]]:
    """A throwaway sshd (key logins only); yields the ssh command line and the port."""
    for name in ("host", "user"):
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", work / name)
    (work / "authorized_keys").write_text((work / "user.pub").read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    kind, key = (work / "host.pub").read_text().split()[:2]
    (work / "known_hosts").write_text(f"[127.0.0.1]:{port} {kind} {key}\n")
    (work / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {work / 'host'}\nPidFile {work / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {work / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nStrictModes no\nUsePAM no\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    proc = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-f", str(work / "sshd_config"), "-E", str(work / "sshd.log")]
    )
    try:
        for _ in range(400):
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.05)
        ssh = (
            f"ssh -F /dev/null -i {work / 'user'} -o IdentitiesOnly=yes -o BatchMode=yes "
            f"-o UserKnownHostsFile={work / 'known_hosts'} -o StrictHostKeyChecking=yes"
        )
        if reuse:
            ssh += f" -o ControlMaster=auto -o ControlPath={work / 'cm'} -o ControlPersist=600"
            # (the master stays in the background holding its output: not through sh())
            subprocess.run(
                [*ssh.split(), "-p", str(port), "root@127.0.0.1", "true"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=True,
                timeout=60,
            )
        yield f"{ssh} -p {port}", port
        if reuse:
            subprocess.run(
                [*ssh.split(), "-p", str(port), "-O", "exit", "root@127.0.0.1"], capture_output=True
            )
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def casfs(store: Path, *args: str | Path, env: dict[str, str] | None = None) -> str:
    return sh(*CLI, "-s", store, *args, env=env)


def piece(rnd: random.Random, text: bool) -> bytes:
    if not text:
        return rnd.randbytes(CHUNK)
    words = ["".join(rnd.choices("abcdefghijklmnopqrstuvwxyz", k=rnd.randint(2, 10))) for _ in range(2000)]
    return " ".join(rnd.choices(words, k=CHUNK // 4)).encode()[:CHUNK].ljust(CHUNK, b"\n")


def change(store: Path, image: Path, size: int, total: int, seed: int, text: bool) -> None:
    """Write `total` bytes in 64 KiB pieces at random offsets into the volume and the image."""
    rnd = random.Random(seed)
    offsets = sorted(rnd.sample(range(size // CHUNK), total // CHUNK))
    writes = [(o * CHUNK, piece(rnd, text)) for o in offsets]
    repo = Repository.open(store)
    try:
        v = open_volume(repo, "vm1")
        for offset, data in writes:
            v.write_sync(ROOT_INO, offset, data)
        v.close()
    finally:
        repo.close()
    fd = os.open(image, os.O_WRONLY)
    try:
        for offset, data in writes:
            os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def pull(b: Path, url: str, env: dict[str, str]) -> tuple[float, int]:
    t = time.perf_counter()
    doc = json.loads(casfs(b, "pull", url, "vm1", "--json", env=env))
    return time.perf_counter() - t, int(doc["bytes"])


def rsync(ssh: str, src: Path, dest: Path) -> tuple[float, int]:
    t = time.perf_counter()
    out = sh("rsync", "-a", "--inplace", "--stats", "-e", ssh, f"root@127.0.0.1:{src}", dest)
    elapsed = time.perf_counter() - t
    m = re.search(r"Total bytes received: ([\d,]+)", out)
    assert m, out
    return elapsed, int(m.group(1).replace(",", ""))


def run(work: Path, size: int, total: int, reps: int, text: bool, reuse: bool) -> dict[str, Any]:
    image = work / "disk.img"
    generate(image, size, seed=1, runs="zrt")
    a = work / "a"
    casfs(a, "init")
    casfs(a, "image", "import", "disk", image)
    casfs(a, "volume", "create", "vm1", "--from", "disk")
    casfs(a, "snapshot", "create", "vm1")
    figures: dict[str, list[float]] = {}
    with sshd(work, reuse) as (ssh, port):
        env = {
            **os.environ,
            "CASFS_SSH": ssh.rsplit(" -p ", 1)[0],
            "CASFS_REMOTE": f"env PYTHONPATH={ROOT} {sys.executable} -m casfs",
        }
        url = f"ssh://root@127.0.0.1:{port}{a}"
        for rep in range(reps):
            b, copy, source = work / f"b{rep}", work / f"copy{rep}.img", work / f"src{rep}.img"
            casfs(b, "init")
            sh("cp", "--sparse=always", image, source)
            for name, (secs, nbytes) in (
                ("full casfs", pull(b, url, env)),
                ("full rsync", rsync(ssh, source, copy)),
            ):
                figures.setdefault(f"{name} s", []).append(secs)
                figures.setdefault(f"{name} bytes", []).append(nbytes)
            change(a, source, size, total, rep + 2, text)
            for name, (secs, nbytes) in (
                ("incr casfs", pull(b, url, env)),
                ("incr rsync", rsync(ssh, source, copy)),
            ):
                figures.setdefault(f"{name} s", []).append(secs)
                figures.setdefault(f"{name} bytes", []).append(nbytes)
            sh("cmp", source, copy)
            casfs(b, "snapshot", "export", f"vm1@{rep + 2}", work / f"check{rep}.img")
            sh("cmp", source, work / f"check{rep}.img")
            for path in (copy, source, work / f"check{rep}.img"):
                path.unlink()
            sh("rm", "-rf", b)
            image.unlink(missing_ok=True)
            casfs(a, "snapshot", "export", f"vm1@{rep + 2}", image)  # the next round's start
    med = {k: statistics.median(v) for k, v in figures.items()}
    ratios = {
        f"{what} {unit}": med[f"{what} rsync {unit}"] / med[f"{what} casfs {unit}"]
        for what in ("full", "incr")
        for unit in ("s", "bytes")
    }
    return {
        "size": size,
        "change": total,
        "change_data": "text" if text else "random",
        "reuse_ssh": reuse,
        "reps": reps,
        "median": med,
        "rsync_over_casfs": ratios,
    }


def main() -> None:
    p = arguments(__doc__)
    p.add_argument("--size", default="1G")
    p.add_argument("--change", default="10M")
    p.add_argument("--change-data", choices=("random", "text"), default="random")
    p.add_argument("--reuse-ssh", action="store_true", help="one persistent ssh connection for all")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    stop_on_sigterm()
    size, total = parse_size(args.size), parse_size(args.change)
    with scratch(args.workdir, "casfs-replica-bench-", mounts=()) as work:
        report = run(work, size, total, args.reps, args.change_data == "text", args.reuse_ssh)
    med, r = report["median"], report["rsync_over_casfs"]
    how = f"{report['change_data']} data" + (", one persistent ssh connection" if args.reuse_ssh else "")
    lines = [
        f"pull over ssh to 127.0.0.1: {format_size(size)} block volume, {format_size(total)} changed ({how})"
    ]
    head = ("casfs s", "rsync s", "casfs bytes", "rsync bytes")
    lines.append(f"{'':12} {head[0]:>9} {head[1]:>9} {head[2]:>12} {head[3]:>12}  rsync/casfs time, bytes")
    for what, label in (("full", "full"), ("incr", "incremental")):
        sizes = [format_size(int(med[f"{what} {peer} bytes"])) for peer in ("casfs", "rsync")]
        lines.append(
            f"{label:12} {med[f'{what} casfs s']:9.2f} {med[f'{what} rsync s']:9.2f} "
            f"{sizes[0]:>12} {sizes[1]:>12}  {r[f'{what} s']:.1f}x, {r[f'{what} bytes']:.1f}x"
        )
    emit(report, args.json, *lines)


if __name__ == "__main__":
    main()
