"""Read/write BLOCK volumes through real mounts, driven by the tools hypervisors use
(dd, qemu-img, qemu-io, losetup + mkfs.ext4 + mount) and checked against a reference
file on the native filesystem.

A block volume is reached two ways, and the tests that can tell them apart run both:

  file    `casfs mount FILE --volume NAME`: the volume is the mount point, a regular
          file (the kernel's writeback cache is off for this mount)
  store   volumes/NAME of a whole-store mount (writeback cache on: the mount also
          serves directory volumes)

Every store is checked with fsck when its test ends (tests/conftest.py). Loop devices and the
kernel mounts on them are undone in `finally`, before the casfs mount is.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import random
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from casfs import images, volumes
from casfs.ids import ChunkNo
from casfs.kinds import MAX_BLOCK_SIZE, VolumeKind
from casfs.repo import Repository
from casfs.snapshots.chunkmap import Content
from casfs.store.ids import BlobId
from tests.helpers import blobs as blob_files
from tests.helpers.cli import fails, js, must, out, run
from tests.helpers.fsck import fsck_clean
from tests.helpers.mount import Mount, cleanup, kernel_mounted, mounted, start_daemon, wait_gone

KIB = 1 << 10
MIB = 1 << 20
CHUNK = VolumeKind.BLOCK.default_chunk_size  # (the disk images here are imported with the default)
# dd block sizes: a sector, a page, a chunk, and odd ones that straddle all of them.
BLOCK_SIZES = (512, 4096, 65536, 777, 5000)
HOW = ("file", "store")


# -- helpers -------------------------------------------------------------------------------


def volume_info(store: Path, name: str) -> dict[str, Any]:
    info: dict[str, Any] = json.loads(out(store, "volume", "info", name, "--json"))
    return info


def same_bytes(a: Path, b: Path) -> None:
    done = run(["cmp", a, b], timeout=120)
    assert done.returncode == 0, f"cmp {a} {b}: {done.stdout}{done.stderr}"


def same_bytes_direct(path: Path, ref: Path) -> None:
    """Read `path` with O_DIRECT (as qemu's cache=none does) and compare."""
    line = f"dd if='{path}' iflag=direct bs=1M status=none | cmp - '{ref}'"
    done = run(["bash", "-o", "pipefail", "-c", line], timeout=120)
    assert done.returncode == 0, f"{line}: {done.stdout}{done.stderr}"


def make_disk(path: Path, size: int, seed: int) -> None:
    """Random, zero and compressible chunks (a partial one at the end if size says so)."""
    rnd = random.Random(seed)
    parts = []
    for i in range(-(-size // CHUNK)):
        kind = i % 5
        if kind == 1:
            parts.append(bytes(CHUNK))
        elif kind == 3:
            parts.append(bytes([i % 256]) * CHUNK)
        else:
            parts.append(rnd.randbytes(CHUNK))
    path.write_bytes(b"".join(parts)[:size])


def dd_write(data: Path, target: Path, offset: int, length: int, bs: int, direct: bool) -> None:
    """`length` bytes of `data` at byte `offset` of `target`, in `bs`-sized writes."""
    oflag = "seek_bytes,direct" if direct else "seek_bytes"
    must(
        "dd",
        f"if={data}",
        f"of={target}",
        f"bs={bs}",
        f"count={length}",
        f"seek={offset}",
        "iflag=count_bytes",
        f"oflag={oflag}",
        "conv=notrunc",
        "status=none",
    )


def random_dd_writes(rnd: random.Random, target: Path, ref: Path, n: int, scratch: Path) -> None:
    """n dd writes at random offsets and lengths (some all zeros), done to `target` with
    dd and to `ref` with plain Python."""
    size = ref.stat().st_size
    with open(ref, "r+b") as r:
        for _ in range(n):
            bs = rnd.choice(BLOCK_SIZES)
            direct = rnd.random() < 0.5
            length = min(size, rnd.choice([1, bs, rnd.randint(1, 3 * CHUNK), rnd.randint(1, 4 * bs)]))
            offset = rnd.randrange(0, size - length + 1)
            if rnd.random() < 0.4:
                offset -= offset % 512
            payload = bytes(length) if rnd.random() < 0.15 else rnd.randbytes(length)
            scratch.write_bytes(payload)
            dd_write(scratch, target, offset, length, bs, direct)
            r.seek(offset)
            r.write(payload)


@contextlib.contextmanager
def block_file(store: Path, tmp_path: Path, volume: str, how: str) -> Iterator[tuple[Mount, Path]]:
    """Mount `volume` and yield (the mount, the block file)."""
    if how == "file":
        target = tmp_path / f"{volume}.img"
        target.touch()
        with mounted(store, target, volume=volume) as m:
            yield m, m.path
    else:
        with mounted(store, tmp_path / "mnt") as m:
            yield m, m.path / "volumes" / volume


@contextlib.contextmanager
def loop_device(path: Path, read_only: bool = False) -> Iterator[str]:
    dev = must("losetup", "--find", "--show", *(["--read-only"] if read_only else []), path).strip()
    try:
        yield dev
    finally:
        done = run(["losetup", "-d", dev], timeout=60)
        assert done.returncode == 0, f"losetup -d {dev}: {done.stderr}"


def blank_volume(store: Path, name: str, size: str) -> None:
    out(store, "volume", "create", name, "--blank-block", size)


def test_the_largest_volume_keeps_writes_at_both_ends(repo: Repository, tmp_path: Path) -> None:
    """A blank volume of the largest size is created at once, takes O_DIRECT writes at
    its first and last blocks (its upper file, as large as the volume, fits in ext4,
    whose largest file is 16 TiB less 4 KiB: a 16 TiB volume took no write at all),
    keeps them across a snapshot and a remount; a bigger one is refused."""
    size = MAX_BLOCK_SIZE
    assert "at most 16 TiB less 1 MiB" in fails(
        repo.path, 2, "volume", "create", "big", "--blank-block", "16T"
    )
    blank_volume(repo.path, "big", str(size))
    ends = {0: os.urandom(4 * KIB), size - 4 * KIB: os.urandom(4 * KIB)}
    buf = mmap.mmap(-1, 4 * KIB)
    with block_file(repo.path, tmp_path, "big", "file") as (_, path):
        assert path.stat().st_size == size
        fd = os.open(path, os.O_RDWR | os.O_DIRECT)
        try:
            for offset, data in ends.items():
                buf[:] = data
                assert os.pwritev(fd, [buf], offset) == len(data)
            os.fsync(fd)
        finally:
            os.close(fd)
        must("setfattr", "-n", "user.casfs.snapshot", "-v", "ends", path)
    with block_file(repo.path, tmp_path, "big", "file") as (_, path):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            for offset, data in ends.items():
                assert os.preadv(fd, [buf], offset) == len(data) and buf[:] == data
            assert os.preadv(fd, [buf], size // 2) == len(buf) and buf[:] == bytes(len(buf))
        finally:
            os.close(fd)
    assert [s["n"] for s in js(repo.path, "snapshot", "ls", "big")] == [1]  # (nothing changed after it)


# -- dd against a reference ----------------------------------------------------------------


def test_dd_random_writes_match_a_reference(repo: Repository, tmp_path: Path) -> None:
    """Random dd writes (O_DIRECT or not, block sizes from a sector to odd ones) over an
    imported disk: the same bytes as the reference while mounted, after a remount, in
    the snapshot taken at unmount, and in a volume cloned from it; the image never moves."""
    size = 6 * MIB + 5000  # not a whole number of chunks
    raw, ref, scratch = tmp_path / "disk.raw", tmp_path / "ref.raw", tmp_path / "scratch"
    make_disk(raw, size, seed=1)
    shutil.copyfile(raw, ref)
    images.import_image(repo, "disk", raw)
    volumes.create_volume(repo, "v", volumes.Source(image="disk"))
    rnd = random.Random(2)
    with block_file(repo.path, tmp_path, "v", "file") as (_, path):
        assert path.stat().st_size == size
        same_bytes(path, ref)
        random_dd_writes(rnd, path, ref, 40, scratch)
        same_bytes(path, ref)
        same_bytes_direct(path, ref)
        assert path.stat().st_size == size
    assert volume_info(repo.path, "v")["snapshots"] == [1]
    first = tmp_path / "first.raw"
    shutil.copyfile(ref, first)
    out(repo.path, "snapshot", "export", "v@1", tmp_path / "v1.raw")
    same_bytes(tmp_path / "v1.raw", first)

    with block_file(repo.path, tmp_path, "v", "file") as (_, path):
        same_bytes(path, ref)  # after a remount
        random_dd_writes(rnd, path, ref, 25, scratch)
        same_bytes(path, ref)
    assert volume_info(repo.path, "v")["snapshots"] == [1, 2]
    out(repo.path, "volume", "create", "w", "--from", "v@2")
    with block_file(repo.path, tmp_path, "w", "file") as (_, path):
        same_bytes(path, ref)
    assert volume_info(repo.path, "w")["snapshots"] == []  # unchanged: no snapshot

    out(repo.path, "snapshot", "export", "v@1", tmp_path / "v1-again.raw")
    same_bytes(tmp_path / "v1-again.raw", first)
    out(repo.path, "image", "export", "disk", tmp_path / "image.raw")
    same_bytes(tmp_path / "image.raw", raw)


# -- zeros, holes, a fixed size ------------------------------------------------------------


@pytest.mark.parametrize("how", HOW)
def test_blank_volume_zeros_fixed_size_and_zero_writes_free_chunks(
    repo: Repository, tmp_path: Path, how: str
) -> None:
    size = 64 * MIB
    blank_volume(repo.path, "b", "64M")
    blank = volume_info(repo.path, "b")
    rnd = random.Random(3)
    spots = sorted(rnd.sample(range(size // CHUNK), 24))
    with block_file(repo.path, tmp_path, "b", how) as (_, path):
        assert path.stat().st_size == size
        must("cmp", "-n", str(size), path, "/dev/zero", timeout=120)  # unwritten reads as zeros

        fd = os.open(path, os.O_RDWR)
        try:
            for n in spots:
                os.pwrite(fd, rnd.randbytes(CHUNK), n * CHUNK)
            os.fsync(fd)
            full = volume_info(repo.path, "b")
            assert full["stored"] >= blank["stored"] + len(spots) * CHUNK
            assert full["unique"] >= len(spots) * CHUNK

            # Zeros over every written chunk: whole chunks, and one chunk in 4 KiB pieces.
            for n in spots[1:]:
                os.pwrite(fd, bytes(CHUNK), n * CHUNK)
            for off in range(0, CHUNK, 4096):
                os.pwrite(fd, bytes(4096), spots[0] * CHUNK + off)
            os.fsync(fd)
            zeroed = volume_info(repo.path, "b")
            assert zeroed["stored"] <= blank["stored"] + 4 * KIB, (blank, zeroed)
            assert zeroed["unique"] <= blank["unique"] + 4 * KIB, (blank, zeroed)

            # Writes never change the size: one crossing the end is cut short, one past it
            # fails, and the bytes before the end are written.
            tail = rnd.randbytes(4096)
            assert os.pwrite(fd, tail, size - 100) == 100
            with pytest.raises(OSError) as past:
                os.pwrite(fd, tail, size)
            assert past.value.errno == errno.ENOSPC
            os.fsync(fd)
            assert os.pread(fd, 200, size - 200) == bytes(100) + tail[:100]
            assert os.fstat(fd).st_size == size
        finally:
            os.close(fd)
        # dd past the end reports the failure (no silent loss in a write-back cache)
        (tmp_path / "src").write_bytes(tail * 2)
        done = run(
            [
                "dd",
                f"if={tmp_path / 'src'}",
                f"of={path}",
                "bs=4096",
                f"seek={size - 100}",
                "oflag=seek_bytes",
                "conv=notrunc,fsync",
                "status=none",
            ]
        )
        assert done.returncode != 0 and "No space left" in done.stderr, done.stderr
        assert path.stat().st_size == size

        # Resizing is a CLI operation, never truncate(2).
        for new in ("1M", "128M", "0"):
            done = run(["truncate", "-s", new, path])
            assert done.returncode != 0 and "not permitted" in done.stderr, done.stderr
        with pytest.raises(OSError) as refused:
            os.truncate(path, size + CHUNK)
        assert refused.value.errno == errno.EPERM
        assert path.stat().st_size == size
        must("cmp", "-n", str(size - 100), path, "/dev/zero", timeout=120)

    after = volume_info(repo.path, "b")
    assert after["snapshots"] == [1] and after["size"] == size
    assert after["stored"] <= blank["stored"] + CHUNK  # the tail chunk, and new map pages


# -- durability ----------------------------------------------------------------------------


@pytest.mark.parametrize("how", HOW)
def test_fdatasync_survives_kill_9(repo: Repository, tmp_path: Path, how: str) -> None:
    size = 16 * MIB
    blank_volume(repo.path, "b", "16M")
    ref = tmp_path / "ref.raw"
    with open(ref, "wb") as f:
        f.truncate(size)
    rnd = random.Random(4)
    if how == "file":
        mountpoint = tmp_path / "b.img"
        mountpoint.touch()
        m = start_daemon(repo.path, mountpoint, volume="b")
        path = mountpoint
    else:
        mountpoint = tmp_path / "mnt"
        mountpoint.mkdir()
        m = start_daemon(repo.path, mountpoint)
        path = mountpoint / "volumes" / "b"
    try:
        fd = os.open(path, os.O_RDWR)
        direct = os.open(path, os.O_RDWR | os.O_DIRECT)
        aligned = mmap.mmap(-1, 8192)  # page-aligned memory for O_DIRECT
        with open(ref, "r+b") as r:
            try:
                for i in range(30):
                    length = rnd.choice([1, 512, 4096, CHUNK + 3, 3 * CHUNK])
                    offset = rnd.randrange(0, size - length)
                    data = rnd.randbytes(length)
                    assert os.pwrite(fd, data, offset) == length
                    (os.fdatasync if i % 2 else os.fsync)(fd)
                    r.seek(offset)
                    r.write(data)
                for _ in range(5):
                    offset = rnd.randrange(0, size // 4096) * 4096
                    data = rnd.randbytes(8192)
                    aligned[:] = data
                    assert os.pwrite(direct, aligned, offset) == 8192
                    os.fdatasync(direct)
                    r.seek(offset)
                    r.write(data)
            finally:
                os.close(direct)
                os.close(fd)
                aligned.close()
        os.kill(m.pid, signal.SIGKILL)
        assert wait_gone(m.pid, m.proc, 30)
    finally:
        cleanup(m.path, m.pid, m.proc)
    fsck_clean(repo.path)  # the overlay of a crashed mount is consistent as it is
    with block_file(repo.path, tmp_path, "b", how) as (_, path):
        same_bytes(path, ref)
    assert volume_info(repo.path, "b")["snapshots"] == [1]
    out(repo.path, "snapshot", "export", "b@1", tmp_path / "b1.raw")
    same_bytes(tmp_path / "b1.raw", ref)


# -- a file system on a loop device --------------------------------------------------------


def populate(top: Path, seed: int) -> None:
    rnd = random.Random(seed)
    (top / "dir" / "deeper").mkdir(parents=True)
    (top / "small.txt").write_text("hello from ext4 on casfs\n" * 20)
    (top / "random.bin").write_bytes(rnd.randbytes(700 * KIB + 13))
    (top / "dir" / "zeros.bin").write_bytes(bytes(300 * KIB))
    for i in range(40):
        (top / "dir" / "deeper" / f"f{i}").write_bytes(rnd.randbytes(rnd.randint(0, 20 * KIB)))
    os.symlink("small.txt", top / "link")
    os.link(top / "random.bin", top / "dir" / "hard.bin")


def same_tree(a: Path, b: Path) -> None:
    done = run(["diff", "-r", "--no-dereference", "-x", "lost+found", a, b], timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("how", HOW)
def test_losetup_mkfs_ext4_mount_and_back(repo: Repository, tmp_path: Path, how: str) -> None:
    blank_volume(repo.path, "b", "64M")
    ref = tmp_path / "ref"
    ref.mkdir()
    populate(ref, seed=5)
    with block_file(repo.path, tmp_path, "b", how) as (_, path), loop_device(path) as dev:
        must("mkfs.ext4", "-q", "-F", dev, timeout=120)
        with kernel_mounted(tmp_path / "ext", dev) as ext:
            populate(ext, seed=5)
            same_tree(ref, ext)
        must("e2fsck", "-fn", dev, timeout=120)
    assert volume_info(repo.path, "b")["snapshots"] == [1]
    with block_file(repo.path, tmp_path, "b", how) as (_, path), loop_device(path, read_only=True) as dev:
        must("e2fsck", "-fn", dev, timeout=120)
        with kernel_mounted(tmp_path / "ext", "-o", "ro", dev) as ext:
            same_tree(ref, ext)
    assert volume_info(repo.path, "b")["snapshots"] == [1]  # read only: nothing changed


# -- qemu ----------------------------------------------------------------------------------


def test_qemu_img_and_qemu_io(repo: Repository, tmp_path: Path) -> None:
    size = 16 * MIB
    blank_volume(repo.path, "b", "16M")
    ref = tmp_path / "ref.raw"
    make_disk(ref, size, seed=6)
    with block_file(repo.path, tmp_path, "b", "file") as (_, path):
        info = json.loads(must("qemu-img", "info", "--output=json", "-f", "raw", path))
        assert info["format"] == "raw" and info["virtual-size"] == size
        # A whole disk written through O_DIRECT; qemu writes its zero runs as it can.
        must("qemu-img", "convert", "-n", "-t", "none", "-f", "raw", "-O", "raw", ref, path, timeout=120)
        must("qemu-img", "compare", "-f", "raw", "-F", "raw", ref, path, timeout=120)
        io = ["qemu-io", "-f", "raw"]
        must(*io, "-c", "write -P 0xab 0 1M", "-c", "read -P 0xab 0 1M", path)
        must(*io, "-t", "none", "-c", "write -P 0xcd 1M 64k", "-c", "read -P 0xcd 1M 64k", path)
        must(*io, "--nocache", "-c", "write -P 0x5a 2052096 5120", "-c", "read -P 0x5a 2052096 5120", path)
        must(*io, "-t", "none", "-c", "write -z 4M 1M", "-c", "read -P 0 4M 1M", path)
        said = must(*io, "-t", "none", "-c", "read -P 0xab 0 1M", "-c", "read -P 0xcd 1M 64k", path)
        assert "Pattern verification failed" not in said, said
        with open(ref, "r+b") as r:
            for offset, length, byte in (
                (0, MIB, 0xAB),
                (MIB, 64 * KIB, 0xCD),  # (qemu-io wrote 64k)
                (2052096, 5120, 0x5A),
                (4 * MIB, MIB, 0),
            ):
                r.seek(offset)
                r.write(bytes([byte]) * length)
        same_bytes(path, ref)
        same_bytes_direct(path, ref)
    out(repo.path, "snapshot", "export", "b@1", tmp_path / "b1.raw")
    same_bytes(tmp_path / "b1.raw", ref)


# -- copy-on-write ---------------------------------------------------------------------------


def test_clones_of_one_image_diverge_and_report_unique_bytes(repo: Repository, tmp_path: Path) -> None:
    """Two volumes from one block image, written through one whole-store mount: each
    matches its own reference, the image's bytes never change, and each volume's unique
    bytes are the chunks it rewrote."""
    size = 4 * MIB
    raw = tmp_path / "disk.raw"
    raw.write_bytes(random.Random(7).randbytes(size))  # incompressible: stored = chunk size
    images.import_image(repo, "disk", raw)
    image_stored = json.loads(out(repo.path, "image", "info", "disk", "--json"))["stored"]
    refs = {}
    for name in ("a", "b"):
        volumes.create_volume(repo, name, volumes.Source(image="disk"))
        refs[name] = tmp_path / f"{name}.raw"
        shutil.copyfile(raw, refs[name])
    rnd = random.Random(8)
    # Chunk 5 is written by both, differently; "a" also changes 100 bytes inside chunk 20.
    plan = {
        "a": [(0, CHUNK), (5 * CHUNK, CHUNK), (9 * CHUNK, CHUNK), (20 * CHUNK + 999, 100)],
        "b": [(5 * CHUNK, CHUNK), (33 * CHUNK, 2 * CHUNK)],
    }
    changed_chunks = {"a": 4, "b": 3}
    with block_file(repo.path, tmp_path, "a", "store") as (m, _):
        for name, writes in plan.items():
            path = m.path / "volumes" / name
            with open(path, "r+b") as f, open(refs[name], "r+b") as r:
                for offset, length in writes:
                    data = rnd.randbytes(length)
                    for dest in (f, r):
                        dest.seek(offset)
                        dest.write(data)
        for name in plan:
            same_bytes(m.path / "volumes" / name, refs[name])
        same_bytes(m.path / "images" / "disk", raw)
    with open(refs["a"], "rb") as fa, open(refs["b"], "rb") as fb:
        fa.seek(5 * CHUNK)
        fb.seek(5 * CHUNK)
        assert fa.read(CHUNK) != fb.read(CHUNK)
    for name, n in changed_chunks.items():
        info = volume_info(repo.path, name)
        assert info["snapshots"] == [1]
        # the rewritten chunks, plus a new map root (a few hundred bytes)
        assert n * CHUNK <= info["unique"] <= n * CHUNK + 16 * KIB, (name, info)
        assert info["stored"] <= image_stored + n * CHUNK + 16 * KIB, (name, info)
        out(repo.path, "volume", "export", name, tmp_path / f"{name}-out.raw")
        same_bytes(tmp_path / f"{name}-out.raw", refs[name])
    out(repo.path, "image", "export", "disk", tmp_path / "image.raw")
    same_bytes(tmp_path / "image.raw", raw)
    with block_file(repo.path, tmp_path, "a", "store") as (m, _):
        for name in plan:
            same_bytes(m.path / "snapshots" / name / "1", refs[name])
            same_bytes(m.path / "volumes" / name, refs[name])
        same_bytes(m.path / "images" / "disk", raw)


# -- snapshots while mounted, rollback -----------------------------------------------------


@pytest.mark.parametrize("how", HOW)
def test_setfattr_snapshot_holds_unsynced_writes_and_rollback(
    repo: Repository, tmp_path: Path, how: str
) -> None:
    size = 8 * MIB
    blank_volume(repo.path, "b", "8M")
    rnd = random.Random(9)
    spots = [(rnd.randrange(0, size - 20 * KIB), rnd.randint(1, 20 * KIB)) for _ in range(12)]
    state_a, state_b = bytearray(size), bytearray(size)
    with block_file(repo.path, tmp_path, "b", how) as (_, path):
        fd = os.open(path, os.O_RDWR)
        try:
            for offset, length in spots:  # no fsync: the snapshot must sync them itself
                data = rnd.randbytes(length)
                os.pwrite(fd, data, offset)
                state_a[offset : offset + length] = data
            done = run(["setfattr", "-n", "user.casfs.snapshot", "-v", "before", path])
            assert done.returncode == 0, done.stderr
            assert must("getfattr", "--only-values", "-n", "user.casfs.snapshots", path) == "1"
            state_b[:] = state_a
            for offset, length in spots[::2]:
                data = rnd.randbytes(length)
                os.pwrite(fd, data, offset)
                state_b[offset : offset + length] = data
        finally:
            os.close(fd)
    snaps = volumes.list_snapshots(repo, "b")
    assert [(s.n, s.label) for s in snaps] == [(1, "before"), (2, None)]
    (tmp_path / "a.raw").write_bytes(state_a)
    (tmp_path / "b.raw").write_bytes(state_b)
    out(repo.path, "snapshot", "export", "b@1", tmp_path / "b1.raw")
    out(repo.path, "snapshot", "export", "b@2", tmp_path / "b2.raw")
    same_bytes(tmp_path / "b1.raw", tmp_path / "a.raw")
    same_bytes(tmp_path / "b2.raw", tmp_path / "b.raw")

    out(repo.path, "rollback", "b", "1")
    with block_file(repo.path, tmp_path, "b", how) as (m, path):
        same_bytes(path, tmp_path / "a.raw")
        if how == "store":
            same_bytes(m.path / "snapshots" / "b" / "2", tmp_path / "b.raw")
    assert [s.n for s in volumes.list_snapshots(repo, "b")] == [1, 2]  # unchanged: none taken


def test_a_corrupt_chunk_fails_each_random_read_of_it_until_healed(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 KiB O_DIRECT reads of a clone, as a VM reads its disk at random, with no chunk
    cache (each read decodes and checks its chunk): a chunk that goes bad after reads of
    it (its place in the store remembered by the daemon, store.located) fails every read
    of it with EIO and is counted; the rest read right; a copy stored again (healed, by
    another process) is read from then on."""
    size = 2 * MIB
    raw = tmp_path / "disk.raw"
    make_disk(raw, size, seed=3)
    data = raw.read_bytes()
    images.import_image(repo, "disk", raw)
    volumes.create_volume(repo, "v", volumes.Source(image="disk"))
    root = BlobId(bytes.fromhex(images.get_image(repo, "disk").root or ""))
    n = 7  # (a random chunk: make_disk)
    victim = Content(repo.get, root, size, CHUNK).chunk(ChunkNo(n))
    monkeypatch.setenv("CASFS_CHUNK_CACHE_MB", "0")
    target = tmp_path / "v.img"
    target.touch()
    with mounted(repo.path, target, volume="v"):
        fd = os.open(target, os.O_RDONLY | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, 4 * KIB)

            def read(offset: int) -> bytes:
                assert os.preadv(fd, [buf], offset) == len(buf)
                return bytes(buf)

            blocks = [n * CHUNK + i for i in (0, CHUNK // 2, CHUNK - 4 * KIB)]
            for offset in blocks * 2:
                assert read(offset) == data[offset : offset + 4 * KIB]
            blob_files.corrupt(repo, victim)
            for offset in blocks:
                with pytest.raises(OSError) as e:
                    read(offset)
                assert e.value.errno == errno.EIO
            assert read((n + 1) * CHUNK) == data[(n + 1) * CHUNK : (n + 2) * CHUNK][: 4 * KIB]
            assert int(must("getfattr", "--only-values", "-n", "user.casfs.corrupt_reads", target)) >= 3
            repo.blobs.put(data[n * CHUNK : (n + 1) * CHUNK])  # (the damaged mark makes it a new copy)
            for offset in blocks:
                assert read(offset) == data[offset : offset + 4 * KIB]
        finally:
            os.close(fd)
