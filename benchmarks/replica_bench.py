#!/usr/bin/env python3
"""Replicating a block volume over ssh: `casfs pull` beside `rsync -a --inplace` of the
raw image, through the same ssh to a throwaway sshd on 127.0.0.1.

    python benchmarks/replica_bench.py [--size 1G] [--change 10M]
                                       [--change-data random|text|files] [--reps 3]
                                       [--no-full] [--scaling 1G,16G] [--workdir DIR] [--json]
    python benchmarks/replica_bench.py --follow [--size 1G] [--change 10M] [--reps 3]

One image of --size (a third zeros, a third random, a third text: benchlib.generate) is
imported into store A, a volume made from it and snapshotted (vm1@1). Then, each
repetition into a fresh store B and a fresh copy target:

  full          `casfs pull ssh://…/A vm1` into an empty store B, beside `rsync -a
                --inplace` of the raw image to a path where it does not exist yet
  incremental   --change bytes written into A's volume (the same bytes at the same
                offsets into the raw image), the volume unmounted (vm1@N), then `casfs
                pull` again, beside rsync of the changed image onto the previous copy
                (its delta algorithm): cold, with no ssh connection up
  repeated      another change, pulled the same way right after: casfs through the ssh
                connection and the source-side server its last pull left up
                (replica.sharing), rsync through the same ssh connection (the same
                ControlPath; rsync starts its remote side in a session each time)

--scaling 1G,16G runs the scaling section instead: the incremental pull's time against
the volume's size (issue 29's targets: the time grows with the change, not the volume).
For each size, one image (as above) in a subvolume of a btrfs on a loop file, snapshot
s1; store A imports s1's image (vm1@1); the change is written into A's volume (vm1@2)
and the btrfs file (snapshot s2). Then, each from the same before and after, the
destination synced (`sync -f`) inside each timing:

  casfs   `casfs pull A vm1` through a local pipe into store B holding vm1@1
  btrfs   `btrfs send -p s1 s2 | btrfs receive` into a second btrfs holding s1
  rsync   `rsync -a --inplace` of the changed file onto a copy of s1's (local: whole file)

Ratios: casfs at the largest size over the smallest; rsync and btrfs over casfs. Each
loop device and mount is removed in `finally` (rsync, btrfs-progs:
scripts/install-bench.sh).

--no-full leaves the full pull untimed: store B gets vm1@1 through a local pipe (`casfs
pull A vm1`) and the copy is the image copied (cp), so a run measures the other two.

Beside the cold incremental, the floors it cannot go under, timed right after it: `ssh
connect`, a fresh connection running `true` (the handshake and a session: what rsync's
cold run pays too), and `+ remote casfs`, the same running `casfs --version` (the
source's interpreter and CLI start on top).

The change is --change-data: `random` (64 KiB pieces of random bytes at random
offsets: incompressible, so no transfer can move less than it), `text` (the same
pieces of text), or `files` (what a guest writing files does: 1 MiB extents at random
offsets, three of four text and one random, i.e. compressed already).

Time is the command's wall time; bytes are what crossed ssh towards the receiver (casfs:
the bytes read from the connection, `pull --json`; rsync: "Total bytes received" of
--stats). Before a cold run the shared connection and server are ended (by pid). The
ratios are rsync over casfs: above 1, casfs is faster or moves less. Medians over
--reps. sshd and rsync: scripts/install.sh installs them. (--follow measures something
else: see "Following an unmount" below.)
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
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
EXTENT = 1 << 20  # a file's contiguous extent (--change-data files)
ROOT = Path(__file__).resolve().parents[1]
WHAT = {"full": "full", "incr": "incremental", "repeat": "repeated"}
FLOORS = {"ssh": "ssh connect", "remote": "+ remote casfs"}


@contextlib.contextmanager
def sshd(work: Path) -> Iterator[tuple[str, int]]:
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
        yield (
            (
                f"ssh -F /dev/null -i {work / 'user'} -o IdentitiesOnly=yes -o BatchMode=yes "
                f"-o UserKnownHostsFile={work / 'known_hosts'} -o StrictHostKeyChecking=yes"
            ),
            port,
        )
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


class Shared:
    """The ssh connection and source-side server casfs pull shares between pulls
    (replica.sharing), in private directories of this run: `here` on the pulling side,
    `far` on the source side (this machine too), both short (a socket path's limit)."""

    def __init__(self, ssh: str, port: int) -> None:
        self.here, self.far = (Path(tempfile.mkdtemp(prefix=f"rb-{side}-")) for side in ("here", "far"))
        self.ssh, self.port = ssh, port
        (self.here / "casfs-ssh").mkdir(mode=0o700)  # (rsync may come first)
        # rsync's ssh: casfs's options for the same master (replica.sharing._options)
        self.rsync_ssh = (
            f"{ssh} -o ControlMaster=auto -o ControlPath={self.here}/casfs-ssh/%C -o ControlPersist=60 "
            f"-p {port}"
        )

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CASFS_SSH": self.ssh,
            "CASFS_REMOTE": f"env PYTHONPATH={ROOT} XDG_RUNTIME_DIR={self.far} {sys.executable} -m casfs",
            "XDG_RUNTIME_DIR": str(self.here),
        }

    def floors(self) -> dict[str, float]:
        """Seconds of a fresh ssh connection running `true`, and running the source's
        `casfs --version` (no master: ControlPath=none)."""
        ssh = [*self.ssh.split(), "-o", "ControlPath=none", "-p", str(self.port), "root@127.0.0.1"]
        out = {}
        for what, command in (("ssh", "true"), ("remote", f"{self.env()['CASFS_REMOTE']} --version")):
            t = time.perf_counter()
            sh(*ssh, command)
            out[what] = time.perf_counter() - t
        return out

    def pids(self) -> list[int]:
        found = []
        for pid_file in (self.far / "casfs-ssh").glob("serve-*.pid"):
            with contextlib.suppress(OSError, ValueError):
                found.append(int(pid_file.read_text()))
        done = subprocess.run(
            [*self.rsync_ssh.split(), "-O", "check", "root@127.0.0.1"], capture_output=True, text=True
        )
        if m := re.search(r"\(pid=(\d+)\)", done.stderr):
            found.append(int(m.group(1)))
        return [p for p in found if alive(p)]

    def stop(self) -> None:
        """End the master and the servers by pid (a cold start follows)."""
        left = self.pids()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while any(alive(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self.stop()
        for d in (self.here, self.far):
            shutil.rmtree(d, ignore_errors=True)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def casfs(store: Path, *args: str | Path, env: dict[str, str] | None = None) -> str:
    return sh(*CLI, "-s", store, *args, env=env)


def writes(rnd: random.Random, size: int, total: int, data: str) -> list[tuple[int, bytes]]:
    """`total` bytes to write at offsets in a volume of `size` (see the module)."""
    if data != "files":
        offsets = sorted(rnd.sample(range(size // CHUNK), total // CHUNK))
        return [(o * CHUNK, text(rnd, CHUNK) if data == "text" else rnd.randbytes(CHUNK)) for o in offsets]
    extents = sorted(rnd.sample(range(size // EXTENT), max(1, total // EXTENT)))
    return [
        (e * EXTENT, rnd.randbytes(EXTENT) if i % 4 == 3 else text(rnd, EXTENT))
        for i, e in enumerate(extents)
    ]


def text(rnd: random.Random, n: int) -> bytes:
    words = ["".join(rnd.choices("abcdefghijklmnopqrstuvwxyz", k=rnd.randint(2, 10))) for _ in range(2000)]
    return " ".join(rnd.choices(words, k=n // 4)).encode()[:n].ljust(n, b"\n")


def change(store: Path, image: Path, size: int, total: int, seed: int, data: str) -> None:
    """Write the change into the volume (then unmount it: a snapshot) and the image."""
    done = writes(random.Random(seed), size, total, data)
    repo = Repository.open(store)
    try:
        v = open_volume(repo, "vm1")
        for offset, piece in done:
            v.write_sync(ROOT_INO, offset, piece)
        v.close()
    finally:
        repo.close()
    fd = os.open(image, os.O_WRONLY)
    try:
        for offset, piece in done:
            os.pwrite(fd, piece, offset)
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


def run(work: Path, size: int, total: int, reps: int, data: str, full: bool = True) -> dict[str, Any]:
    image = work / "disk.img"
    generate(image, size, seed=1, runs="zrt")
    a = work / "a"
    casfs(a, "init")
    casfs(a, "image", "import", "disk", image)
    casfs(a, "volume", "create", "vm1", "--from", "disk")
    casfs(a, "snapshot", "create", "vm1")
    figures: dict[str, list[float]] = {}

    def note(what: str, peer: str, measured: tuple[float, int]) -> None:
        figures.setdefault(f"{what} {peer} s", []).append(measured[0])
        figures.setdefault(f"{what} {peer} bytes", []).append(measured[1])

    with sshd(work) as (ssh, port):
        shared = Shared(ssh, port)
        try:
            env, url = shared.env(), f"ssh://root@127.0.0.1:{port}{a}"
            for rep in range(reps):
                b, copy, source = work / f"b{rep}", work / f"copy{rep}.img", work / f"src{rep}.img"
                casfs(b, "init")
                sh("cp", "--sparse=always", image, source)
                if not full:  # (vm1@1 and the copy there untimed)
                    casfs(b, "pull", a, "vm1")
                    sh("cp", "--sparse=always", image, copy)
                    os.utime(copy, (0, 0))  # (older than the change: rsync's quick check sees it)
                for what in ("full", "incr", "repeat") if full else ("incr", "repeat"):
                    if what != "full":
                        change(a, source, size, total, 10 * rep + len(what), data)
                    if what == "repeat":  # (through what casfs's cold pull left up)
                        note(what, "casfs", pull(b, url, env))
                        note(what, "rsync", rsync(shared.rsync_ssh, source, copy))
                        continue
                    shared.stop()
                    note(what, "rsync", rsync(shared.rsync_ssh, source, copy))
                    shared.stop()
                    note(what, "casfs", pull(b, url, env))
                    if what == "incr":
                        for floor, seconds in shared.floors().items():
                            figures.setdefault(f"floor {floor} s", []).append(seconds)
                sh("cmp", source, copy)
                last = casfs(b, "snapshot", "ls", "vm1", "--json")
                newest = max(int(s["n"]) for s in json.loads(last))
                casfs(b, "snapshot", "export", f"vm1@{newest}", work / f"check{rep}.img")
                sh("cmp", source, work / f"check{rep}.img")
                for path in (copy, source, work / f"check{rep}.img"):
                    path.unlink()
                sh("rm", "-rf", b)
                image.unlink(missing_ok=True)
                casfs(a, "snapshot", "export", f"vm1@{newest}", image)  # the next round's start
        finally:
            shared.close()
    med = {k: statistics.median(v) for k, v in figures.items()}
    ratios = {
        f"{what} {unit}": med[f"{what} rsync {unit}"] / med[f"{what} casfs {unit}"]
        for what in WHAT
        if f"{what} casfs s" in med
        for unit in ("s", "bytes")
    }
    return {
        "size": size,
        "change": total,
        "change_data": data,
        "reps": reps,
        "median": med,
        "rsync_over_casfs": ratios,
    }


# -- scaling: the incremental pull against the volume's size (--scaling) ---------------


@contextlib.contextmanager
def btrfs(work: Path, name: str, size: int) -> Iterator[Path]:
    """A btrfs on a sparse loop file of `size` bytes, mounted at work/NAME; unmounted and
    its loop device detached however the block ends."""
    backing, mnt = work / f"{name}.btrfs", work / name
    with open(backing, "wb") as f:
        f.truncate(size)
    loop = sh("losetup", "--find", "--show", backing).strip()
    try:
        sh("mkfs.btrfs", "-q", loop)
        mnt.mkdir()
        sh("mount", loop, mnt)
        try:
            yield mnt
        finally:
            sh("umount", mnt)
            mnt.rmdir()
    finally:
        sh("losetup", "-d", loop)
        backing.unlink()


def synced(dest: Path, *cmd: str | Path, shell: str | None = None) -> float:
    """Seconds of a command (or a shell pipeline) and the sync of the filesystem it wrote."""
    t = time.perf_counter()
    if shell is not None:
        sh("bash", "-o", "pipefail", "-c", shell, timeout=3600)
    else:
        sh(*cmd, timeout=3600)
    sh("sync", "-f", dest)
    return time.perf_counter() - t


def scaling_one(work: Path, size: int, total: int, data: str) -> dict[str, float]:
    """One size: the three incremental transfers of the same change (see the module)."""
    room = size + size // 4 + (1 << 30)
    out: dict[str, float] = {}
    with btrfs(work, "bsrc", room) as src:
        sh("btrfs", "subvolume", "create", src / "vol")
        live = src / "vol" / "disk.img"
        generate(live, size, seed=1, runs="zrt")
        sh("sync", "-f", live)
        sh("btrfs", "subvolume", "snapshot", "-r", src / "vol", src / "s1")
        a, b = work / "sa", work / "sb"
        casfs(a, "init")
        casfs(a, "image", "import", "disk", src / "s1" / "disk.img")
        casfs(a, "volume", "create", "vm1", "--from", "disk")
        casfs(a, "snapshot", "create", "vm1")
        change(a, live, size, total, seed=2, data=data)
        sh("sync", "-f", live)
        sh("btrfs", "subvolume", "snapshot", "-r", src / "vol", src / "s2")

        with btrfs(work, "bdst", room) as dst:
            sh("bash", "-o", "pipefail", "-c", f"btrfs send -q {src / 's1'} | btrfs receive -q {dst}")
            send = f"btrfs send -q -p {src / 's1'} {src / 's2'} | btrfs receive -q {dst}"
            out["btrfs s"] = synced(dst, shell=send)

        casfs(b, "init")
        t = time.perf_counter()
        casfs(b, "pull", a, "vm1", "--snapshot", "1")
        out["first pull s"] = time.perf_counter() - t
        t = time.perf_counter()
        doc = json.loads(casfs(b, "pull", a, "vm1", "--json"))
        sh("sync", "-f", b)
        out["casfs s"] = time.perf_counter() - t
        out["casfs bytes"] = float(doc["bytes"])
        roots = [
            {s["n"]: s["root"] for s in json.loads(casfs(x, "snapshot", "ls", "vm1", "--json"))}
            for x in (a, b)
        ]
        assert roots[0][2] == roots[1][2], roots  # (the same snapshot landed)
        sh("rm", "-rf", b)

        copy = work / "copy.img"
        sh("cp", "--sparse=always", src / "s1" / "disk.img", copy)
        os.utime(copy, (0, 0))  # (older than the change: rsync's quick check sees it)
        out["rsync s"] = synced(copy, "rsync", "-a", "--inplace", live, copy)
        sh("cmp", live, copy)
        copy.unlink()
        sh("rm", "-rf", a)
    return out


def scaling(work: Path, sizes: list[int], total: int, data: str) -> dict[str, Any]:
    per = {format_size(size): scaling_one(work, size, total, data) for size in sizes}
    small, large = per[format_size(sizes[0])], per[format_size(sizes[-1])]
    return {
        "change": total,
        "change_data": data,
        "sizes": per,
        "casfs_large_over_small": large["casfs s"] / small["casfs s"],
        "rsync_over_casfs": {k: v["rsync s"] / v["casfs s"] for k, v in per.items()},
        "casfs_over_btrfs": {k: v["casfs s"] / v["btrfs s"] for k, v in per.items()},
    }


def scaling_lines(report: dict[str, Any]) -> list[str]:
    lines = [
        f"incremental pull against the volume's size: {format_size(report['change'])} changed "
        f"({report['change_data']} data), local pipes, destination synced",
        f"{'size':>10} {'casfs s':>9} {'btrfs s':>9} {'rsync s':>9} {'casfs bytes':>12}  "
        "rsync/casfs  casfs/btrfs  (first pull s)",
    ]
    for size, v in report["sizes"].items():
        lines.append(
            f"{size:>10} {v['casfs s']:9.2f} {v['btrfs s']:9.2f} {v['rsync s']:9.2f} "
            f"{format_size(int(v['casfs bytes'])):>12}  {report['rsync_over_casfs'][size]:10.1f}x "
            f"{report['casfs_over_btrfs'][size]:11.2f}x  ({v['first pull s']:.1f})"
        )
    lines.append(f"casfs, largest over smallest: {report['casfs_large_over_small']:.2f}x (target <= 1.2x)")
    return lines


def main() -> None:
    p = arguments(__doc__)
    p.add_argument("--size", default="1G")
    p.add_argument("--change", default="10M")
    p.add_argument("--change-data", choices=("random", "text", "files"), default="random")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-full", action="store_true", help="time only the incremental and repeated pulls")
    p.add_argument("--scaling", metavar="SIZES", help="the scaling section for these sizes (1G,16G)")
    p.add_argument(
        "--follow", action="store_true", help="time the followers of an unmount (a registry, 3 nodes)"
    )
    args = p.parse_args()
    stop_on_sigterm()
    if args.follow:
        follow_main(args)
        return
    size, total = parse_size(args.size), parse_size(args.change)
    if args.scaling is not None:
        sizes = [parse_size(x) for x in args.scaling.split(",")]
        with scratch(args.workdir, "casfs-replica-scaling-", mounts=("bsrc", "bdst")) as work:
            scaled = scaling(work, sizes, total, args.change_data)
        emit(scaled, args.json, *scaling_lines(scaled))
        return
    with scratch(args.workdir, "casfs-replica-bench-", mounts=()) as work:
        report = run(work, size, total, args.reps, args.change_data, not args.no_full)
    med, r = report["median"], report["rsync_over_casfs"]
    lines = [
        f"pull over ssh to 127.0.0.1: {format_size(size)} block volume, {format_size(total)} changed "
        f"({report['change_data']} data)"
    ]
    head = ("casfs s", "rsync s", "casfs bytes", "rsync bytes")
    lines.append(f"{'':12} {head[0]:>9} {head[1]:>9} {head[2]:>12} {head[3]:>12}  rsync/casfs time, bytes")
    for what, label in WHAT.items():
        if f"{what} casfs s" not in med:
            continue
        moved = [format_size(int(med[f"{what} {peer} bytes"])) for peer in ("casfs", "rsync")]
        lines.append(
            f"{label:12} {med[f'{what} casfs s']:9.2f} {med[f'{what} rsync s']:9.2f} "
            f"{moved[0]:>12} {moved[1]:>12}  {r[f'{what} s']:.1f}x, {r[f'{what} bytes']:.1f}x"
        )
    lines.append(
        "floors of a cold pull: "
        + ", ".join(f"{label} {med[f'floor {k} s']:.2f} s" for k, label in FLOORS.items())
    )
    emit(report, args.json, *lines)


# -- Following an unmount (issue 29: replicated volumes) ---------------------------------
#
# A registry (a throwaway etcd on 127.0.0.1), three stores as three nodes, an agent each
# (`casfs replica agent`, pulling over the throwaway sshd), block volume vm1 of --size
# with factor 3 (every node holds vm1@1 before the clock starts). Each repetition: vm1
# mounted read/write on node a (taking `active`), --change random bytes written through
# the mount, `casfs umount` timed, and then the time from its return until every node's
# store holds the snapshot it took (asked of the stores, every 10 ms). Target: <= 2 s.


@contextlib.contextmanager
def etcd_server(work: Path) -> Iterator[str]:
    """A one-member etcd (Debian's etcd-server); yields its registry URL."""
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
    client, peer = (f"http://127.0.0.1:{p}" for p in ports)
    with open(work / "etcd.log", "wb") as log:
        proc = subprocess.Popen(
            ["etcd", "--name", "b", "--data-dir", str(work / "etcd"), "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls",
             peer, "--initial-cluster", f"b={peer}"],
            stdout=log, stderr=log,
        )  # fmt: skip
    try:
        url = f"etcd://127.0.0.1:{ports[0]}/bench"
        wait_for(lambda: _answers(url), 30, "etcd")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _answers(url: str) -> bool:
    from casfs.errors import CasfsError
    from casfs.replica.registry import Registry

    try:
        Registry(url).revision()
    except CasfsError:
        return False
    return True


def wait_for(check: Any, timeout: float, what: str, step: float = 0.01) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise SystemExit(f"replica_bench: {what} not within {timeout:.0f} s")
        time.sleep(step)


def newest(store: Path, volume: str) -> int:
    from casfs.catalog import volumes as rows
    from casfs.errors import CasfsError

    try:
        repo = Repository.open(store)
    except (CasfsError, sqlite3.OperationalError):  # (an open racing the WAL's close: ask again)
        return 0
    try:
        return max((int(n) for n in rows.snapshot_numbers(repo.conn, volume)), default=0)
    finally:
        repo.close()


def follow(work: Path, size: int, total: int, reps: int) -> dict[str, Any]:
    image = work / "disk.img"
    generate(image, size, seed=1, runs="zrt")
    nodes = {n: work / n for n in ("a", "b", "c")}
    for store in nodes.values():
        casfs(store, "init")
    a = nodes["a"]
    casfs(a, "image", "import", "disk", image)
    casfs(a, "volume", "create", "vm1", "--from", "disk")
    casfs(a, "snapshot", "create", "vm1")
    figures: dict[str, list[float]] = {"umount s": [], "follow s": []}
    agents: list[subprocess.Popen[bytes]] = []
    with etcd_server(work) as url, sshd(work) as (ssh, port):
        shared = Shared(ssh, port)
        env = {**shared.env(), "CASFS_REGISTRY": url, "CASFS_SSH_PERSIST": "60"}
        try:
            casfs(a, "replica", "set-factor", "vm1", "3", env=env)
            for name, store in nodes.items():
                with open(work / f"agent-{name}.log", "wb") as log:
                    agents.append(subprocess.Popen(
                        [*CLI, "-s", str(store), "replica", "agent", "--node", name,
                         "--reach", f"ssh://root@127.0.0.1:{port}{store}"],
                        stdout=log, stderr=log, env=env,
                    ))  # fmt: skip
            wait_for(lambda: all(newest(s, "vm1") >= 1 for s in nodes.values()), 600, "vm1@1 everywhere", 0.2)
            rnd = random.Random(7)
            for _ in range(reps):
                disk = work / "vm1.raw"
                disk.touch()
                casfs(a, "mount", disk, "--volume", "vm1", "--node", "a", env=env)
                fd = os.open(disk, os.O_WRONLY)
                try:
                    for offset, piece in writes(rnd, size, total, "random"):
                        os.pwrite(fd, piece, offset)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                t = time.perf_counter()
                took = casfs(a, "umount", disk, "--node", "a", env=env)
                done = time.perf_counter()
                n = int(took.strip().split("@")[-1])
                wait_for(lambda n=n: all(newest(s, "vm1") >= n for s in nodes.values()), 120, f"vm1@{n}")
                figures["umount s"].append(done - t)
                figures["follow s"].append(time.perf_counter() - done)
        finally:
            for proc in agents:
                proc.terminate()
                proc.wait(timeout=30)
            shared.close()
    med = {k: statistics.median(v) for k, v in figures.items()}
    return {"size": size, "change": total, "reps": reps, "median": med, "all": figures}


def follow_main(args: Any) -> None:
    size, total = parse_size(args.size), parse_size(args.change)
    with scratch(args.workdir, "casfs-follow-bench-", mounts=("casfs",)) as work:
        report = follow(work, size, total, args.reps)
    med = report["median"]
    emit(
        report,
        args.json,
        f"following an unmount: {format_size(size)} block volume, {format_size(total)} changed, factor 3 "
        f"(three stores, agents pulling over ssh to 127.0.0.1)",
        f"umount on the active node {med['umount s']:.2f} s; then every replica holds the snapshot "
        f"{med['follow s']:.2f} s later (target <= 2 s); medians of {report['reps']}",
    )


if __name__ == "__main__":
    main()
