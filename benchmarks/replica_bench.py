#!/usr/bin/env python3
"""Replicating a block volume over ssh: `casfs pull` beside `rsync -a --inplace` of the
raw image, through the same ssh to a throwaway sshd on 127.0.0.1.

    python benchmarks/replica_bench.py [--size 1G] [--change 10M]
                                       [--change-data random|text|files] [--reps 3]
                                       [--no-full] [--workdir DIR] [--json]
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


def main() -> None:
    p = arguments(__doc__)
    p.add_argument("--size", default="1G")
    p.add_argument("--change", default="10M")
    p.add_argument("--change-data", choices=("random", "text", "files"), default="random")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-full", action="store_true", help="time only the incremental and repeated pulls")
    p.add_argument(
        "--follow", action="store_true", help="time the followers of an unmount (a registry, 3 nodes)"
    )
    args = p.parse_args()
    stop_on_sigterm()
    if args.follow:
        follow_main(args)
        return
    size, total = parse_size(args.size), parse_size(args.change)
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
        sizes = [format_size(int(med[f"{what} {peer} bytes"])) for peer in ("casfs", "rsync")]
        lines.append(
            f"{label:12} {med[f'{what} casfs s']:9.2f} {med[f'{what} rsync s']:9.2f} "
            f"{sizes[0]:>12} {sizes[1]:>12}  {r[f'{what} s']:.1f}x, {r[f'{what} bytes']:.1f}x"
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
