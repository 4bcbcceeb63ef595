"""An fsx-style model test through a real mount: one seeded sequence of operations
applied to a mounted directory volume and to a directory on the native filesystem
(ext4), comparing every outcome (errno, bytes read) and, every CHECK_EVERY steps and at
the end, the whole trees. Now and then a snapshot is taken by setfattr in the middle of
it all; at the end the volume is unmounted (a snapshot), mounted again and compared
once more, and fsck must be clean.

Paths come from a small pool of names under a few fixed parents, so operations collide
(EEXIST, ENOTEMPTY, EISDIR, ENOTDIR, EXDEV never: one volume). A few file descriptors
stay open across steps, so writes and reads go on through unlinked and renamed files.

An odd seed mounts with the kernel's cache of entries and attributes (a user's mount),
an even one without (every lookup and getattr reaches casfs).

Run with CASFS_MODEL_SEED=N to replay a failure (the seed is in the failure message),
and CASFS_MODEL_STEPS=N for a longer run. Not compared: atime and mtime (two
filesystems written at different moments), inode numbers, directory sizes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from casfs import volumes
from casfs.repo import Repository
from tests.helpers import trees
from tests.helpers.cli import casfs, run
from tests.helpers.mount import mounted

STEPS = int(os.environ.get("CASFS_MODEL_STEPS", "10000"))  # about 20 s
CHECK_EVERY = int(os.environ.get("CASFS_MODEL_CHECK_EVERY", "300"))
FILES = ["f0", "f1", "f2", "f3", "f4", "f5"]
DIRS = ["d0", "d1", "d2"]
LINKS = ["s0", "s1"]
PARENTS = ["", "d0", "d1", "d0/d1", "d1/d2", "d0/d1/d2"]
SLOTS = 3
IGNORE = ("atime", "mtime")

_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(old: bytes, new: bytes, flags: int) -> None:
    if _libc.renameat2(-100, old, -100, new, ctypes.c_uint(flags)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@dataclass
class Side:
    root: bytes
    is_mount: bool
    fds: dict[int, int] = field(default_factory=dict)

    def p(self, rel: str) -> bytes:
        return self.root + b"/" + rel.encode() if rel else self.root

    def close_all(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


Op = tuple[str, tuple[Any, ...]]


def random_path(rnd: random.Random, pool: list[str]) -> str:
    """Mostly a name of the kind the operation expects, sometimes any (EISDIR & co.)."""
    name = rnd.choice(pool if rnd.random() < 0.85 else FILES + DIRS + LINKS)
    parent = rnd.choice(PARENTS)
    return f"{parent}/{name}" if parent else name


def random_op(rnd: random.Random) -> Op:
    """One operation, drawn from the seed alone (not from either tree's state)."""
    kind = rnd.choices(
        [
            "create", "write", "truncate", "read", "rename", "rename2", "unlink", "mkdir", "rmdir",
            "link", "symlink", "chmod", "setxattr", "removexattr", "fsync", "open_keep", "kept_write",
            "kept_read", "kept_truncate", "kept_close", "snapshot", "listdir", "stat",
        ],
        weights=[8, 14, 5, 6, 5, 2, 4, 4, 2, 3, 3, 3, 3, 1, 2, 5, 5, 3, 1, 2, 0.15, 2, 3],
    )[0]  # fmt: skip
    pool = DIRS if kind in ("mkdir", "rmdir") or (kind == "rename" and rnd.random() < 0.25) else FILES
    path, other = random_path(rnd, LINKS if kind == "symlink" else pool), random_path(rnd, pool)
    offset = rnd.choice([0, rnd.randrange(200_000), rnd.randrange(2_000_000), 65536 * rnd.randrange(1, 6)])
    length = rnd.choice([1, rnd.randrange(1, 5000), rnd.randrange(1, 150_000), 65536])
    fill = rnd.choice(["random", "random", "zeros"])
    slot = rnd.randrange(SLOTS)
    seed = rnd.randrange(1 << 30)
    args: tuple[Any, ...]
    if kind in ("create",):
        args = (path, rnd.choice([0o644, 0o600, 0o755, 0o4755]), rnd.random() < 0.3)
    elif kind in ("write", "kept_write"):
        args = (path, slot, offset, length, fill, seed, rnd.random() < 0.4)  # (last: O_CREAT)
    elif kind in ("truncate", "kept_truncate"):
        args = (path, slot, rnd.choice([0, rnd.randrange(300_000), rnd.randrange(1_500_000)]))
    elif kind in ("read", "kept_read"):
        args = (path, slot, rnd.randrange(300_000), rnd.randrange(1, 200_000))
    elif kind in ("rename", "link"):
        args = (path, other)
    elif kind == "rename2":
        args = (path, other, rnd.choice([1, 2]))  # RENAME_NOREPLACE, RENAME_EXCHANGE
    elif kind == "mkdir":
        args = (path, rnd.choice([0o755, 0o700, 0o2775]))
    elif kind == "symlink":
        args = (rnd.choice([*FILES, *DIRS, "nowhere", "d0/f1"]), path)
    elif kind == "chmod":
        args = (path, rnd.choice([0o644, 0o600, 0o755, 0o700, 0o4755, 0o2755, 0o1777, 0o444]))
    elif kind == "setxattr":
        args = (path, f"user.k{rnd.randrange(4)}", rnd.randbytes(rnd.choice([0, 5, 300])))
    elif kind == "removexattr":
        args = (path, f"user.k{rnd.randrange(4)}")
    elif kind == "open_keep":
        args = (path, slot, rnd.random() < 0.3)
    elif kind == "kept_close":
        args = (slot,)
    elif kind == "listdir":
        args = (rnd.choice(PARENTS),)
    else:  # fsync, unlink, rmdir, snapshot, stat
        args = (path,)
    return kind, args


def payload(fill: str, length: int, seed: int) -> bytes:
    return bytes(length) if fill == "zeros" else random.Random(seed).randbytes(length)


def _with_fd(path: bytes, flags: int, fn: Callable[[int], object]) -> object:
    fd = os.open(path, flags, 0o644)
    try:
        return fn(fd)
    finally:
        os.close(fd)


def _kept(side: Side, slot: int) -> int:
    fd = side.fds.get(slot)
    if fd is None:
        raise OSError(errno.EBADF, "no file open in this slot")
    return fd


def do(side: Side, op: Op) -> object:
    """Apply one operation; what it returned (compared between the two sides)."""
    kind, a = op
    if kind == "create":
        path, mode, excl = a
        flags = os.O_CREAT | os.O_WRONLY | (os.O_EXCL if excl else 0)
        os.close(os.open(side.p(path), flags, mode))
        return None
    if kind == "write":
        path, _, offset, length, fill, seed, creat = a
        data = payload(fill, length, seed)
        flags = os.O_WRONLY | (os.O_CREAT if creat else 0)
        return _with_fd(side.p(path), flags, lambda fd: os.pwrite(fd, data, offset))
    if kind == "kept_write":
        _, slot, offset, length, fill, seed, _ = a
        data = payload(fill, length, seed)
        return os.pwrite(_kept(side, slot), data, offset)
    if kind == "truncate":
        os.truncate(side.p(a[0]), a[2])
        return None
    if kind == "kept_truncate":
        os.ftruncate(_kept(side, a[1]), a[2])
        return None
    if kind == "read":
        path, _, offset, length = a
        return _with_fd(side.p(path), os.O_RDONLY, lambda fd: os.pread(fd, length, offset))
    if kind == "kept_read":
        _, slot, offset, length = a
        fd = _kept(side, slot)
        return (os.pread(fd, length, offset), os.fstat(fd).st_size, os.fstat(fd).st_nlink)
    if kind == "rename":
        os.rename(side.p(a[0]), side.p(a[1]))
        return None
    if kind == "rename2":
        renameat2(side.p(a[0]), side.p(a[1]), a[2])
        return None
    if kind == "unlink":
        os.unlink(side.p(a[0]))
        return None
    if kind == "mkdir":
        os.mkdir(side.p(a[0]), a[1])
        return None
    if kind == "rmdir":
        os.rmdir(side.p(a[0]))
        return None
    if kind == "link":
        os.link(side.p(a[0]), side.p(a[1]), follow_symlinks=False)
        return None
    if kind == "symlink":
        os.symlink(a[0], side.p(a[1]))
        return None
    if kind == "chmod":
        os.chmod(side.p(a[0]), a[1])
        return None
    if kind == "setxattr":
        os.setxattr(side.p(a[0]), a[1], a[2])
        return None
    if kind == "removexattr":
        os.removexattr(side.p(a[0]), a[1])
        return None
    if kind == "fsync":
        return _with_fd(side.p(a[0]), os.O_RDONLY, os.fsync)
    if kind == "open_keep":
        path, slot, trunc = a
        old = side.fds.pop(slot, None)
        if old is not None:
            os.close(old)
        side.fds[slot] = os.open(side.p(path), os.O_RDWR | (os.O_TRUNC if trunc else 0))
        return None
    if kind == "kept_close":
        fd = _kept(side, a[0])
        del side.fds[a[0]]
        os.close(fd)
        return None
    if kind == "listdir":
        return sorted(os.listdir(side.p(a[0])))
    if kind == "stat":
        st = os.lstat(side.p(a[0]))
        size = None if stat.S_ISDIR(st.st_mode) else st.st_size  # (directory sizes differ)
        return (st.st_mode, st.st_nlink, size, st.st_uid, st.st_gid)
    if kind == "snapshot":
        if side.is_mount:
            done = run(["setfattr", "-n", "user.casfs.snapshot", os.fsdecode(side.root)])
            assert done.returncode == 0, done.stderr
        return None
    raise AssertionError(f"unknown operation {kind}")


def setup(side: Side) -> None:
    """The parents exist at the start (operations may remove and remake them)."""
    for parent in PARENTS[1:]:
        os.mkdir(side.p(parent))


def outcome(side: Side, op: Op) -> object:
    try:
        return ("ok", do(side, op))
    except OSError as e:
        return ("error", errno.errorcode.get(e.errno or 0, e.errno))


def describe(op: Op) -> str:
    kind, args = op
    shown = [a if not isinstance(a, bytes) or len(a) < 20 else f"<{len(a)} bytes>" for a in args]
    return f"{kind}{tuple(shown)}"


def short(value: object) -> str:
    text = repr(value)
    return text if len(text) < 300 else text[:300] + "..."


def test_model_against_ext4(repo: Repository, tmp_path: Path) -> None:
    seed = int(os.environ.get("CASFS_MODEL_SEED", str(random.randrange(1 << 32))))
    # An odd seed mounts as a user does: the kernel keeps entries and attributes (its
    # cache must stay true through every change); an even one asks casfs every time.
    kernel_cache = seed % 2 == 1
    print(f"model seed {seed} (replay: CASFS_MODEL_SEED={seed}), kernel cache {kernel_cache}")
    rnd = random.Random(seed)
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    native = tmp_path / "native"
    native.mkdir()
    history: list[str] = []

    def fail(step: int, why: str) -> None:
        recent = "\n  ".join(history[-15:])
        pytest.fail(f"seed {seed}, step {step}: {why}\n last operations:\n  {recent}", pytrace=False)

    def compare(step: int, mnt: Path) -> None:
        diffs = trees.compare(native, mnt, ignore=IGNORE)
        if diffs:
            fail(step, "trees differ:\n  " + "\n  ".join(diffs[:20]))

    started = time.monotonic()
    with mounted(repo.path, tmp_path / "mnt", volume="v", kernel_cache=kernel_cache) as m:
        here, there = Side(os.fsencode(native), False), Side(os.fsencode(m.path), True)
        setup(here)
        setup(there)
        try:
            for step in range(STEPS):
                op = random_op(rnd)
                history.append(f"{step}: {describe(op)}")
                want, got = outcome(here, op), outcome(there, op)
                if want != got:
                    fail(step, f"{describe(op)}: ext4 {short(want)}, casfs {short(got)}")
                if step % CHECK_EVERY == CHECK_EVERY - 1:
                    compare(step, m.path)
        finally:
            here.close_all()
            there.close_all()
        compare(STEPS, m.path)
    # every change went into the snapshot taken at unmount
    with mounted(repo.path, tmp_path / "mnt", volume="v", kernel_cache=kernel_cache) as m:
        compare(STEPS, m.path)
    done = casfs(repo.path, "fsck", timeout=120)
    assert done.returncode == 0, f"seed {seed}: {done.stdout}{done.stderr}"
    print(f"{STEPS} steps in {time.monotonic() - started:.1f} s")
