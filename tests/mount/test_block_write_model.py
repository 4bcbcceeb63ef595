"""A write-heavy model test of a read/write BLOCK volume through a real mount, against
a model of the disk in memory. The volume is mounted on a file (`casfs mount FILE
--volume v`, as hypervisors use it) or reached as volumes/v of a whole-store mount
(where the kernel's writeback cache sits between the writes and the daemon).

One seeded sequence of operations: writes of 1 B to 256 KiB at any offset and
alignment, buffered and O_DIRECT (page-aligned mmap buffers); reads anywhere, compared
with the model; fdatasync and fsync; snapshots by setfattr while writing; clean
remounts; and kill -9 of the daemon (idle, in the middle of a burst of writes and syncs
from another thread, right after a snapshot, in the middle of one, in the middle of the
fold an unmount does), each followed by a mount that must recover.

What a crash may leave (the rule, per 4 KiB block): the block's content at the last
acknowledged sync, or any content written to it since. A sync is acknowledged when
fdatasync or fsync (on any descriptor of the file), a snapshot by setfattr, or a clean
unmount returned success. So everything acknowledged is there exactly, and nothing
reads back that was never written. After the check, what was read is the state.

Snapshots: every snapshot holds the disk as it was when it was taken (one taken by
setfattr: the model at that moment; at a clean unmount: the model then; one that
appears across a crash: the state recovered, which is also the model if the snapshot
was labelled and in flight). Snapshots are exported with the CLI and compared, some
at once (while mounted, before and after later writes) and the last and one in the
middle again at the end. At the end the volume (exported) equals the model, written
out as a plain reference file, and `casfs fsck` is clean.

Run with CASFS_MODEL_SEED=N to replay a failure (the seed is in the failure message),
and CASFS_BLOCK_MODEL_STEPS=N for a longer run (default 300 on a file mount, half that
on a whole-store mount: about 20 and 10 s here, unloaded).
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from casfs import images, volumes
from casfs.fuse.mountinfo import mounts
from casfs.repo import Repository
from tests.helpers.cli import casfs, must, out, run
from tests.helpers.mount import Mount, abort_connection, cleanup, start_daemon, unmount, wait_gone

KIB = 1 << 10
MIB = 1 << 20
BLOCK = 4 * KIB  # the unit of the crash rule, of O_DIRECT, and of the guest's pages
CHUNK = 64 * KIB  # casfs's chunk today: writes straddle it on purpose
SIZE = 10 * MIB + 12 * KIB  # whole 4 KiB blocks, not whole chunks
MAX_WRITE = 256 * KIB
STEPS = int(os.environ.get("CASFS_BLOCK_MODEL_STEPS", "300"))
VOLUME = "v"
KILL_GRACE_S = 10.0  # for a killed daemon to end, and a child of it that does not touch the mount

Digest = bytes


def digest(block: bytes | bytearray | memoryview) -> Digest:
    return hashlib.blake2b(block, digest_size=16).digest()


def digests(data: bytes | bytearray) -> list[Digest]:
    view = memoryview(data)
    return [digest(view[i : i + BLOCK]) for i in range(0, len(data), BLOCK)]


def blocks_of(offset: int, length: int) -> range:
    return range(offset // BLOCK, (offset + length - 1) // BLOCK + 1)


TEXT = b"".join(b"line %d of a text file on a block volume, " % i for i in range(8000))


def make_image(size: int, seed: int) -> bytes:
    """Zeros, random, text and repeated bytes, by chunk and inside chunks."""
    rnd = random.Random(seed)
    parts = []
    for i in range(-(-size // CHUNK)):
        kind = i % 6
        if kind == 1:
            parts.append(bytes(CHUNK))
        elif kind == 2:
            start = rnd.randrange(len(TEXT) - CHUNK)
            parts.append(TEXT[start : start + CHUNK])
        elif kind == 3:
            cut = rnd.randrange(1, CHUNK)  # half zeros, half random, at no particular boundary
            parts.append(bytes(cut) + rnd.randbytes(CHUNK - cut))
        elif kind == 4:
            parts.append(bytes([i % 256]) * CHUNK)
        else:
            parts.append(rnd.randbytes(CHUNK))
    return b"".join(parts)[:size]


# -- the model -----------------------------------------------------------------------------


@dataclass
class Model:
    """The disk as it must read now, as of the last acknowledged sync, and the writes
    since (in order): what a crash may leave."""

    now: bytearray
    acked: bytearray = field(init=False)
    pending: list[tuple[int, bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.acked = bytearray(self.now)

    def write(self, offset: int, data: bytes) -> None:
        self.now[offset : offset + len(data)] = data
        self.pending.append((offset, data))

    def ack(self) -> None:
        self.ack_upto(len(self.pending))

    def ack_upto(self, n: int) -> None:
        """The first `n` pending writes are acknowledged (a sync after them returned)."""
        for offset, data in self.pending[:n]:
            self.acked[offset : offset + len(data)] = data
        del self.pending[:n]

    def reset(self, state: bytes) -> None:
        """After a crash: what was read is the state, acknowledged."""
        self.now[:] = state
        self.acked[:] = state
        self.pending.clear()

    def crash_problems(self, got: bytes) -> list[str]:
        """The blocks of `got` that break the crash rule, described."""
        acked = memoryview(self.acked)
        allowed: dict[int, set[Digest]] = {}
        writers: dict[int, list[int]] = {}
        work = bytearray(self.acked)
        view = memoryview(work)
        for i, (offset, data) in enumerate(self.pending):
            work[offset : offset + len(data)] = data
            for b in blocks_of(offset, len(data)):
                here = slice(b * BLOCK, (b + 1) * BLOCK)
                allowed.setdefault(b, {digest(acked[here])}).add(digest(view[here]))
                writers.setdefault(b, []).append(i)
        problems = []
        seen = memoryview(got)
        for b in range(len(got) // BLOCK):
            here = slice(b * BLOCK, (b + 1) * BLOCK)
            if b not in allowed:
                if seen[here] != acked[here]:
                    problems.append(
                        f"block {b} (offset {b * BLOCK}), not written since the last acknowledged "
                        f"sync, differs from it{first_difference(seen[here], acked[here])}"
                    )
            elif digest(seen[here]) not in allowed[b]:
                lost = " (data acknowledged before is lost)" if seen[here] != acked[here] else ""
                problems.append(
                    f"block {b} (offset {b * BLOCK}) is neither its acknowledged content nor any "
                    f"written since (pending writes {writers[b]} of {len(self.pending)}){lost}"
                )
        return problems


def first_difference(a: memoryview, b: memoryview) -> str:
    for i in range(len(a)):
        if a[i] != b[i]:
            return f": first at byte {i} ({a[i]:#04x}, expected {b[i]:#04x})"
    return ""


def block_diffs(got: bytes | bytearray, want: list[Digest]) -> list[int]:
    have = digests(got)
    if len(have) != len(want):
        return [-1]
    return [b for b, (h, w) in enumerate(zip(have, want, strict=True)) if h != w]


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (the daemon starts its own session)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                found.append(int(entry))
    return found


def describe_process(pid: int) -> str:
    """What each of its threads waits in, and whether it holds /dev/fuse."""
    proc = Path(f"/proc/{pid}")
    try:
        fuse = any(os.readlink(fd) == "/dev/fuse" for fd in (proc / "fd").iterdir())
        threads = [
            f"{(t / 'comm').read_text().strip()} {(t / 'stat').read_text().rsplit(')', 1)[1].split()[0]} "
            f"in {(t / 'wchan').read_text().strip() or '-'}"
            for t in (proc / "task").iterdir()
        ]
    except OSError:
        return f"{pid} (gone)"
    return f"pid {pid} (threads: {'; '.join(threads)}; holds /dev/fuse: {fuse})"


# -- what the test does to the mounted file ------------------------------------------------


@dataclass
class Snap:
    """A snapshot the model knows: what it must hold, and why it exists."""

    want: list[Digest]
    made_by: str


class Harness:
    """One mounted block volume and its model: operations on both, mount lifecycle,
    the crash rule after a kill. Every mount it made is gone after close()."""

    def __init__(self, repo: Repository, tmp: Path, seed: int, how: str) -> None:
        self.repo = repo
        self.store = repo.path
        self.tmp = tmp
        self.rnd = random.Random(seed)
        self.seed = seed
        image = make_image(SIZE, seed)
        raw = tmp / "image.raw"
        raw.write_bytes(image)
        images.import_image(repo, "disk", raw)
        volumes.create_volume(repo, VOLUME, volumes.Source(image="disk"))
        raw.unlink()
        self.model = Model(bytearray(image))
        if how == "file":  # `casfs mount FILE --volume v`: the volume is the mount point
            self.mountpoint = self.path = tmp / "v.img"
            self.mountpoint.touch()
        else:  # volumes/v of a whole-store mount (the kernel's writeback cache is on)
            self.mountpoint = tmp / "mnt"
            self.mountpoint.mkdir()
            self.path = self.mountpoint / "volumes" / VOLUME
        self.volume = VOLUME if how == "file" else None
        self.mount: Mount | None = None
        self.fd = -1
        self.direct = -1
        self.buf = mmap.mmap(-1, MAX_WRITE)  # page-aligned memory for O_DIRECT
        self.snaps: dict[int, Snap] = {}
        self.history: list[str] = []
        self.outcomes: Counter[str] = Counter()  # how the races went, printed at the end
        self.step = 0

    # -- mounts ---------------------------------------------------------------------------

    def start(self) -> None:
        assert self.mount is None
        self.mount = start_daemon(self.store, self.mountpoint, volume=self.volume)
        self.fd = os.open(self.path, os.O_RDWR)
        self.direct = os.open(self.path, os.O_RDWR | os.O_DIRECT)
        assert os.fstat(self.fd).st_size == SIZE

    def close_fds(self) -> None:
        for fd in (self.fd, self.direct):
            if fd >= 0:
                with contextlib.suppress(OSError):  # ENOTCONN after a kill
                    os.close(fd)
        self.fd = self.direct = -1

    def clean_unmount(self) -> None:
        """fusermount3 -u; the daemon must exit 0 (which acknowledges everything)."""
        assert self.mount is not None
        self.close_fds()
        try:
            unmount(self.mount)
        finally:
            cleanup(self.mount.path, self.mount.pid, self.mount.proc)
            self.mount = None
        self.model.ack()

    def kill(self) -> None:
        """kill -9 of the daemon's pid alone (as the OOM killer does). It must end, and
        nothing of it may outlive it: a process stuck holding /dev/fuse keeps the
        connection up with no one to answer, and the mount hangs for ever. That fails
        the test (after the connection is aborted, so that the test does not hang too)."""
        assert self.mount is not None
        m = self.mount
        with contextlib.suppress(ProcessLookupError):
            os.kill(m.pid, signal.SIGKILL)
        gone = wait_gone(m.pid, m.proc, KILL_GRACE_S)
        deadline = time.monotonic() + KILL_GRACE_S
        while (left := group_members(m.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if gone and not left:
            return
        seen = [describe_process(pid) for pid in ([] if gone else [m.pid]) + left]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(m.pid, signal.SIGKILL)
        for info in [i for i in mounts() if i.mountpoint == str(m.path)]:
            abort_connection(info.minor)
        wait_gone(m.pid, m.proc, KILL_GRACE_S)
        self.fail(f"{KILL_GRACE_S} s after kill -9 of the daemon {m.pid}, these live on: {seen}")

    def forget_mount(self) -> None:
        """After a kill: no mount and no daemon are left (fusermount3 -u, then -z)."""
        self.close_fds()
        if self.mount is not None:
            cleanup(self.mount.path, self.mount.pid, self.mount.proc)
            self.mount = None

    def close(self) -> None:
        self.forget_mount()
        self.buf.close()

    # -- reading and checking -------------------------------------------------------------

    def read_all(self) -> bytes:
        parts = []
        for offset in range(0, SIZE, MIB):
            part = os.pread(self.fd, min(MIB, SIZE - offset), offset)
            parts.append(part)
        data = b"".join(parts)
        if len(data) != SIZE:
            self.fail(f"the volume reads {len(data)} bytes, not {SIZE}")
        return data

    def expect_now(self, got: bytes, what: str) -> None:
        if got != self.model.now:
            diffs = block_diffs(got, digests(self.model.now))
            self.fail(f"{what}: {len(diffs)} block(s) differ from the model, first {diffs[:10]}")

    def fail(self, why: str) -> None:
        recent = "\n  ".join(self.history[-20:])
        log = self.mount.log()[-3000:] if self.mount is not None else ""
        pytest.fail(
            f"seed {self.seed} (replay: CASFS_MODEL_SEED={self.seed}), step {self.step}: {why}\n"
            f" last operations:\n  {recent}\n daemon log (tail):\n{log}",
            pytrace=False,
        )

    def snapshot_numbers(self) -> dict[int, str | None]:
        return {s.n: s.label for s in volumes.list_snapshots(self.repo, VOLUME)}

    def export_snapshot(self, n: int) -> bytes:
        dest = self.tmp / f"snap-{n}.raw"
        try:
            out(self.store, "snapshot", "export", f"{VOLUME}@{n}", dest)
            return dest.read_bytes()
        finally:
            dest.unlink(missing_ok=True)

    def check_snapshot(self, n: int) -> None:
        snap = self.snaps[n]
        diffs = block_diffs(self.export_snapshot(n), snap.want)
        if diffs:
            self.fail(f"snapshot {n} ({snap.made_by}): {len(diffs)} block(s) differ, first {diffs[:10]}")

    def register_new_snapshots(self, want: bytes | bytearray, why: str, at_most: int | None = None) -> None:
        """Snapshots the model did not know must hold `want`."""
        new = sorted(set(self.snapshot_numbers()) - set(self.snaps))
        if at_most is not None and len(new) > at_most:
            self.fail(f"{why}: {len(new)} new snapshots {new}, at most {at_most} expected")
        for n in new:
            self.snaps[n] = Snap(digests(want), why)
            self.check_snapshot(n)

    # -- operations -----------------------------------------------------------------------

    def payload(self, offset: int, length: int) -> bytes:
        rnd = self.rnd
        kind = rnd.choices(["random", "zeros", "text", "byte", "copy", "same"], [10, 3, 2, 1, 2, 1])[0]
        if kind == "zeros":
            return bytes(length)
        if kind == "text":
            start = rnd.randrange(len(TEXT) - length + 1)
            return TEXT[start : start + length]
        if kind == "byte":
            return bytes([rnd.randrange(256)]) * length
        if kind == "copy":  # bytes that are elsewhere on the disk already (dedup)
            src = rnd.randrange(SIZE - length + 1)
            return bytes(self.model.now[src : src + length])
        if kind == "same":  # what is there already
            return bytes(self.model.now[offset : offset + length])
        return rnd.randbytes(length)

    def buffered_span(self) -> tuple[int, int]:
        rnd = self.rnd
        length = rnd.choice(
            [
                rnd.randint(1, 16),
                rnd.randint(1, 600),
                rnd.randint(1, 8 * KIB),
                rnd.randint(1, MAX_WRITE),
                BLOCK * rnd.randint(1, MAX_WRITE // BLOCK),
            ]
        )
        where = rnd.choice(["any", "sector", "block", "straddle", "chunk"])
        offset = rnd.randrange(SIZE - length + 1)
        if where == "sector":
            offset -= offset % 512
        elif where == "block":
            offset -= offset % BLOCK
        elif where == "straddle":  # across a block boundary, by a few bytes
            offset = max(0, offset - offset % BLOCK - rnd.randint(1, min(length, 64)))
        elif where == "chunk":
            offset = max(0, offset - offset % CHUNK - rnd.randint(0, min(length, 100)))
        return offset, length

    def direct_span(self) -> tuple[int, int]:
        n = self.rnd.choice([1, 2, 3, 16, self.rnd.randint(1, MAX_WRITE // BLOCK)])
        offset = self.rnd.randrange(SIZE // BLOCK - n + 1) * BLOCK
        return offset, n * BLOCK

    def do_write(self, fd: int, offset: int, data: bytes, buf: mmap.mmap | None) -> None:
        """One pwrite that must be whole; through `buf` (aligned) for O_DIRECT."""
        if buf is None:
            done = os.pwrite(fd, data, offset)
        else:
            buf[: len(data)] = data
            done = os.pwrite(fd, memoryview(buf)[: len(data)], offset)
        if done != len(data):
            self.fail(f"pwrite of {len(data)} bytes at {offset} wrote {done}")

    def op_write(self) -> str:
        offset, length = self.buffered_span()
        data = self.payload(offset, length)
        self.do_write(self.fd, offset, data, None)
        self.model.write(offset, data)
        return f"write({offset}, {length})"

    def op_write_direct(self) -> str:
        offset, length = self.direct_span()
        data = self.payload(offset, length)
        self.do_write(self.direct, offset, data, self.buf)
        self.model.write(offset, data)
        return f"write_direct({offset}, {length})"

    def op_write_past_end(self) -> str:
        """A write across the end is cut short at the end (the size never changes)."""
        offset = SIZE - self.rnd.randint(1, 3 * BLOCK)
        data = self.rnd.randbytes(self.rnd.randint(SIZE - offset + 1, SIZE - offset + 2 * BLOCK))
        done = os.pwrite(self.fd, data, offset)
        if done != SIZE - offset:
            self.fail(f"pwrite of {len(data)} bytes at {offset} across the end wrote {done}")
        self.model.write(offset, data[:done])
        return f"write_past_end({offset}, {len(data)})"

    def op_read(self) -> str:
        length = self.rnd.choice([1, self.rnd.randint(1, 5000), self.rnd.randint(1, 300 * KIB)])
        offset = self.rnd.randrange(SIZE - length + 1)
        got = os.pread(self.fd, length, offset)
        if got != self.model.now[offset : offset + length]:
            self.fail(f"read({offset}, {length}) differs from the model")
        return f"read({offset}, {length})"

    def op_read_direct(self) -> str:
        offset, length = self.direct_span()
        view = memoryview(self.buf)[:length]
        done = os.preadv(self.direct, [view], offset)
        if done != length or view != self.model.now[offset : offset + length]:
            self.fail(f"read_direct({offset}, {length}) differs from the model ({done} bytes read)")
        return f"read_direct({offset}, {length})"

    def op_sync(self) -> str:
        fd = self.rnd.choice([self.fd, self.direct])
        sync = self.rnd.choice([os.fdatasync, os.fdatasync, os.fsync])
        sync(fd)
        self.model.ack()
        return f"{sync.__name__}({'direct' if fd == self.direct else 'buffered'})"

    def setfattr_snapshot(self, label: str) -> subprocess.CompletedProcess[str]:
        return run(["setfattr", "-n", "user.casfs.snapshot", "-v", label, self.path])

    def op_snapshot(self) -> str:
        label = f"step-{self.step}"
        before = set(self.snapshot_numbers())
        done = self.setfattr_snapshot(label)
        if done.returncode != 0:
            self.fail(f"setfattr snapshot: {done.stderr}")
        self.model.ack()
        listed = must("getfattr", "--only-values", "-n", "user.casfs.snapshots", self.path).split()
        new = sorted({int(n) for n in listed} - before)
        if len(new) != 1 or self.snapshot_numbers().get(new[0]) != label:
            self.fail(f"snapshot {label}: new snapshots {new} (listed {listed})")
        self.snaps[new[0]] = Snap(digests(self.model.now), f"setfattr {label}")
        if self.rnd.random() < 0.3:
            self.check_snapshot(new[0])  # while mounted, before any later write
        return f"snapshot -> {new[0]}"

    def op_snapshots(self) -> str:
        """Snapshots in quick succession with a few writes between (folds queue up)."""
        what = []
        for _ in range(self.rnd.randint(2, 4)):
            what.append(self.op_snapshot())
            for _ in range(self.rnd.randint(0, 3)):
                what.append(self.op_write_direct() if self.rnd.random() < 0.5 else self.op_write())
        return ", ".join(what)

    def op_check_snapshot(self) -> str:
        if not self.snaps:
            return "check_snapshot (none yet)"
        n = self.rnd.choice(sorted(self.snaps))
        self.check_snapshot(n)
        return f"check_snapshot({n})"

    def op_remount(self) -> str:
        self.clean_unmount()
        self.register_new_snapshots(self.model.now, f"unmount at step {self.step}", at_most=1)
        self.start()
        self.expect_now(self.read_all(), "after a clean remount")
        return "remount"

    # -- crashes --------------------------------------------------------------------------

    def op_kill(self) -> str:
        """kill -9 whatever the daemon is doing (nothing: the last operation returned)."""
        self.kill()
        self.recover("kill")
        return "kill"

    def op_kill_after_sync(self) -> str:
        offset, length = self.buffered_span()
        data = self.payload(offset, length)
        self.do_write(self.fd, offset, data, None)
        self.model.write(offset, data)
        os.fdatasync(self.fd)
        self.model.ack()
        self.kill()
        self.recover("kill after fdatasync")
        return f"write({offset}, {length}), fdatasync, kill"

    def op_kill_during_writes(self) -> str:
        """Another thread writes and syncs while the daemon is killed."""
        plan: list[tuple[str, int, bytes]] = []  # ("buffered"|"direct", offset, data) or ("sync", n, b"")
        for _ in range(self.rnd.randint(3, 40)):
            if self.rnd.random() < 0.15:
                plan.append(("sync", len(self.model.pending), b""))
                continue
            direct = self.rnd.random() < 0.4
            offset, length = self.direct_span() if direct else self.buffered_span()
            data = self.payload(offset, length)
            plan.append(("direct" if direct else "buffered", offset, data))
            self.model.write(offset, data)  # the model runs ahead: a crash may keep any of it
        acked = [0]  # pending writes covered by the last sync that returned
        finished = [0]  # operations of the plan that returned in full
        errors: list[str] = []
        buf = mmap.mmap(-1, MAX_WRITE)

        def writer() -> None:
            """Until the daemon is gone (an error, or a write cut short: the kernel
            splits a long write into requests, and some went through)."""
            try:
                for kind, n, data in plan:
                    if kind == "sync":
                        os.fdatasync(self.fd)
                        acked[0] = n
                    elif kind == "direct":
                        buf[: len(data)] = data
                        if os.pwrite(self.direct, memoryview(buf)[: len(data)], n) != len(data):
                            return
                    elif os.pwrite(self.fd, data, n) != len(data):
                        return
                    finished[0] += 1
            except OSError as e:
                errors.append(str(e))

        thread = threading.Thread(target=writer)
        thread.start()
        time.sleep(self.rnd.uniform(0, 0.08))
        self.kill()
        thread.join(30)
        if thread.is_alive():
            self.fail("a writer is still blocked 30 s after the daemon was killed")
        buf.close()
        self.model.ack_upto(acked[0])
        self.recover(f"kill during {len(plan)} writes and syncs ({acked[0]} acknowledged)")
        stopped = "all done" if finished[0] == len(plan) else "cut short"
        self.outcomes[f"kill during writes: {stopped}"] += 1
        return f"kill_during_writes({len(plan)} ops, {acked[0]} pending writes acknowledged, {errors[:1]})"

    def op_kill_after_snapshot(self) -> str:
        """The snapshot returned, so it and everything before it is saved (the daemon
        may still be folding it in the background)."""
        what = [self.op_snapshot()]
        for _ in range(self.rnd.randint(0, 4)):  # into the new state, while the old one folds
            what.append(self.op_write_direct() if self.rnd.random() < 0.5 else self.op_write())
        self.kill()
        self.recover("kill after a snapshot")
        return ", ".join([*what, "kill"])

    def op_kill_during_snapshot(self) -> str:
        label = f"step-{self.step}"
        want = bytes(self.model.now)
        proc = subprocess.Popen(
            ["setfattr", "-n", "user.casfs.snapshot", "-v", label, str(self.path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(self.rnd.uniform(0, self.rnd.choice([0.02, 0.15])))  # early, or anywhere
        self.kill()
        returned = proc.wait(30)
        if returned == 0:
            self.model.ack()
        got = self.recover(f"kill during snapshot {label}", snapshot_label=label)
        labels = {v: n for n, v in self.snapshot_numbers().items()}
        if label in labels and got != want:
            self.fail(f"snapshot {label} exists after the crash, the volume reads otherwise")
        if returned == 0 and label not in labels:
            self.fail(f"setfattr returned 0, snapshot {label} is missing")
        self.outcomes[f"kill during snapshot: setfattr {returned}, made {label in labels}"] += 1
        return f"kill_during_snapshot(setfattr {returned}, made {label in labels})"

    def op_kill_during_unmount(self) -> str:
        """fusermount3 -u, then kill -9 while the daemon saves (unless it is done)."""
        assert self.mount is not None
        self.close_fds()
        done = run(["fusermount3", "-u", self.mountpoint])
        if done.returncode != 0:
            self.fail(f"fusermount3 -u: {done.stderr}")
        time.sleep(self.rnd.uniform(0, 0.3))
        m = self.mount
        finished = m.proc is not None and m.proc.poll() is not None
        if finished:
            if m.proc is not None and m.proc.returncode != 0:
                self.fail(f"the daemon exited {m.proc.returncode} after unmount")
            self.model.ack()
        else:
            self.kill()
        self.recover("kill during the unmount's save")
        self.outcomes[f"kill during unmount: {'exited first' if finished else 'killed'}"] += 1
        return f"kill_during_unmount({'exited first' if finished else 'killed'})"

    def recover(self, why: str, snapshot_label: str | None = None) -> bytes:
        """Mount again after a crash and check what is there: the crash rule; every new
        snapshot holds what is read now. The model becomes what is read."""
        self.forget_mount()
        self.start()
        got = self.read_all()
        problems = self.model.crash_problems(got)
        if problems:
            self.fail(
                f"after {why}: {len(problems)} block(s) break the crash rule:\n  "
                + "\n  ".join(problems[:10])
            )
        self.model.reset(got)
        self.register_new_snapshots(got, f"recovery after {why}")
        return got

    def op(self, name: str) -> Callable[[], str]:
        fn: Callable[[], str] = getattr(self, f"op_{name}")
        return fn

    # -- the end --------------------------------------------------------------------------

    def finish(self) -> None:
        """Unmount cleanly; the last snapshot and one in the middle hold what they held;
        the volume's export is the model, written out as a plain reference file."""
        self.clean_unmount()
        self.register_new_snapshots(self.model.now, "the last unmount", at_most=1)
        numbers = sorted(self.snaps)
        assert numbers, "no snapshot at all"
        again = {numbers[-1], numbers[len(numbers) // 2]}
        for n in sorted(again):
            self.check_snapshot(n)
        reference = self.tmp / "reference.raw"
        reference.write_bytes(self.model.now)
        exported = self.tmp / "volume.raw"
        out(self.store, "volume", "export", VOLUME, exported)
        done = run(["cmp", exported, reference], timeout=120)
        if done.returncode != 0:
            self.fail(f"the exported volume differs from the reference: {done.stdout}{done.stderr}")
        fsck = casfs(self.store, "fsck", timeout=120)
        if fsck.returncode != 0:
            self.fail(f"fsck: {fsck.stdout}{fsck.stderr}")


OPS = {
    "write": 30,
    "write_direct": 20,
    "write_past_end": 0.5,
    "read": 8,
    "read_direct": 6,
    "sync": 8,
    "snapshot": 1.5,
    "snapshots": 0.4,
    "check_snapshot": 0.4,
    "remount": 0.6,
    "kill": 0.5,
    "kill_after_sync": 0.5,
    "kill_during_writes": 0.8,
    "kill_after_snapshot": 0.4,
    "kill_during_snapshot": 0.4,
    "kill_during_unmount": 0.4,
}


@contextlib.contextmanager
def harness(repo: Repository, tmp: Path, seed: int, how: str = "file") -> Iterator[Harness]:
    h = Harness(repo, tmp, seed, how)
    try:
        yield h
    finally:
        h.close()


@pytest.mark.parametrize("how", ["file", "store"])
def test_random_writes_syncs_snapshots_and_kills(repo: Repository, tmp_path: Path, how: str) -> None:
    """The file mount is the one hypervisors use: the whole run. The whole-store mount
    (the kernel's writeback cache between the writes and the daemon): half of it."""
    seed = int(os.environ.get("CASFS_MODEL_SEED", str(random.randrange(1 << 32))))
    print(f"model seed {seed} (replay: CASFS_MODEL_SEED={seed})")
    steps = STEPS if how == "file" else STEPS // 2
    started = time.monotonic()
    names, weights = list(OPS), list(OPS.values())
    counts: dict[str, int] = dict.fromkeys(OPS, 0)
    with harness(repo, tmp_path, seed, how) as h:
        h.start()
        h.expect_now(h.read_all(), "the clone before any write")
        for step in range(steps):
            h.step = step
            name = h.rnd.choices(names, weights)[0]
            h.history.append(f"{step}: {name} ...")
            h.history[-1] = f"{step}: {h.op(name)()}"
            counts[name] += 1
        h.step = steps
        h.finish()
    took = time.monotonic() - started
    print(f"{how}: {steps} steps in {took:.1f} s: {counts}; {len(h.snaps)} snapshots; {dict(h.outcomes)}")


def test_fdatasync_of_unaligned_writes_survives_kill_9(repo: Repository, tmp_path: Path) -> None:
    """Writes that straddle 4 KiB blocks and a 64 KiB chunk, one O_DIRECT, then
    fdatasync and kill -9 at once: every byte is there after the remount, exactly, in the
    snapshot the next unmount takes, and in the export."""
    with harness(repo, tmp_path, seed=11) as h:
        h.start()
        writes = [
            (3 * BLOCK - 100, 200),  # across one block boundary
            (CHUNK - 5, 9),  # across a chunk boundary
            (5 * CHUNK + 1, 3 * BLOCK + 7),  # starts one byte in, ends mid-block
            (SIZE - 777, 777),  # the tail
        ]
        for offset, length in writes:
            data = h.rnd.randbytes(length)
            h.do_write(h.fd, offset, data, None)
            h.model.write(offset, data)
        aligned = h.rnd.randbytes(2 * BLOCK)
        h.do_write(h.direct, 7 * CHUNK - BLOCK, aligned, h.buf)  # O_DIRECT across a chunk boundary
        h.model.write(7 * CHUNK - BLOCK, aligned)
        os.fdatasync(h.fd)
        h.model.ack()
        want = bytes(h.model.now)
        h.kill()
        got = h.recover("fdatasync and kill -9")  # no pending write: every block exactly
        assert got == want
        h.finish()


def test_the_crash_rule_itself() -> None:
    """The model's rule, without a mount: any block from its history since the last
    acknowledged sync passes (blocks torn apart from each other included); a block
    that never was, or one older than acknowledged, fails."""
    model = Model(bytearray(4 * BLOCK))
    model.write(100, b"a" * 10)
    model.ack()
    acked = bytes(model.now)
    model.write(BLOCK - 2, b"b" * 4)  # blocks 0 and 1
    first = bytes(model.now)
    model.write(BLOCK - 1, b"c" * 2)  # blocks 0 and 1 again
    for fine in (acked, first, bytes(model.now), first[:BLOCK] + acked[BLOCK:]):
        assert model.crash_problems(fine) == []
    never = bytearray(model.now)
    never[BLOCK - 2] = 0  # the second write without the first: block 0 never was that
    lost = bytearray(acked)
    lost[100:110] = bytes(10)  # block 0 older than acknowledged
    untouched = bytearray(acked)
    untouched[3 * BLOCK] = 1  # a block nobody wrote since the sync
    for bad, block in ((never, 0), (lost, 0), (untouched, 3)):
        problems = model.crash_problems(bytes(bad))
        assert len(problems) == 1 and problems[0].startswith(f"block {block} "), problems
    model.ack_upto(1)  # a sync after the first write returned
    assert model.crash_problems(acked) != []
    assert model.crash_problems(first) == []
