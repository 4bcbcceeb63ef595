"""When the store cannot take data, a mounted volume loses nothing it acknowledged.

The store is made to fail for real: `chattr +i STORE/tmp` refuses every staging
directory (as a full or read-only disk would) until it is lifted; and a small ext4
filesystem on a loop device, filled up, gives real ENOSPC.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs import volumes
from casfs.lifecycle.queue import acquire_slot, queue_limit
from casfs.repo import Repository
from tests.helpers.cli import casfs, run
from tests.helpers.fsck import fsck_clean
from tests.helpers.mount import fsync, is_mounted, kernel_mounted, mounted, running, wait_gone


@pytest.fixture
def store(store: Path) -> Path:
    """The store, with a blank directory volume `v`."""
    with contextlib.closing(Repository.open(store)) as repo:
        volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    return store


@contextlib.contextmanager
def store_refuses_writes(store: Path) -> Iterator[None]:
    """The store's disk refuses every new byte: blob staging, and the upper files
    (new ones, and writes into those there), as a full disk would."""
    (store / "upper").mkdir(exist_ok=True)
    where = [str(store / "tmp"), str(store / "upper")]
    subprocess.run(["chattr", "-R", "+i", *where], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-R", "-i", *where], check=True)


@contextlib.contextmanager
def blobs_refused(store: Path) -> Iterator[None]:
    """Only new blobs are refused (their staging directory): the upper files take writes."""
    subprocess.run(["chattr", "+i", str(store / "tmp")], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(store / "tmp")], check=True)


def test_a_failed_fsync_then_a_good_one_keeps_everything_after_kill_9(store: Path, tmp_path: Path) -> None:
    """Issue 7, defect 1, through a mount: what the second fsync acknowledged survives."""
    mnt = tmp_path / "mnt"
    with running(store, mnt, volume="v") as m:
        (mnt / "a").write_bytes(b"first")
        fsync(mnt / "a")
        with store_refuses_writes(store):
            os.rename(mnt / "a", mnt / "b")
            (mnt / "marker").write_bytes(b"")
            with open(mnt / "b", "ab") as f:
                f.write(b" and more")
            with pytest.raises(OSError):
                fsync(mnt / "b")
        fsync(mnt / "b")  # the store recovered: this one is acknowledged
        os.kill(m.pid, signal.SIGKILL)
        assert wait_gone(m.pid, m.proc, 30)
        assert run(["fusermount3", "-u", "-z", mnt]).returncode == 0
    with mounted(store, mnt, volume="v") as m:
        assert sorted(os.listdir(m.path)) == ["b", "marker"]
        assert (m.path / "b").read_bytes() == b"first and more"


def test_umount_refuses_when_it_cannot_save_and_loses_nothing(store: Path, tmp_path: Path) -> None:
    """Issue 7, defect 3: `casfs umount` saves first; if it cannot, it exits non-zero and
    the volume stays mounted with the data readable; once the store recovers, it saves."""
    mnt = tmp_path / "mnt"
    data = os.urandom(300_000)
    with running(store, mnt, volume="v") as m:
        with store_refuses_writes(store):
            (mnt / "unsynced").write_bytes(data)  # no fsync: kept in the daemon's memory
            done = casfs(store, "umount", mnt)
            assert done.returncode == 1, done
            assert "not unmounting" in done.stderr and "EPERM (Operation not permitted)" in done.stderr
            assert "free space" not in done.stderr  # (issue 32: the disk is not full)
            assert len(done.stderr.strip().splitlines()) == 1
            assert is_mounted(mnt)
            assert (mnt / "unsynced").read_bytes() == data
        done = casfs(store, "umount", mnt)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "snapshot v@1"
        assert wait_gone(m.pid, m.proc, 30)
    with mounted(store, mnt, volume="v") as m:
        assert (m.path / "unsynced").read_bytes() == data


def test_a_forced_unmount_that_cannot_save_says_what_was_lost(store: Path, tmp_path: Path) -> None:
    """Issue 7, defect 3: fusermount3 -u while the store refuses: the daemon exits
    non-zero, its run file and log say what was not saved, and so do the next mount
    and `casfs volume info`."""
    mnt = tmp_path / "mnt"
    with running(store, mnt, volume="v") as m:
        (mnt / "saved").write_bytes(b"safe")
        fsync(mnt / "saved")
        with store_refuses_writes(store):
            (mnt / "lost").write_bytes(b"x" * 5000)
            assert run(["fusermount3", "-u", mnt]).returncode == 0
            assert wait_gone(m.pid, m.proc, 30)
        assert m.proc is not None and m.proc.returncode == 1
        runs = [json.loads(p.read_text()) for p in (store / "run").glob("*.json")]
        assert [(r["clean"], r["unsaved"]) for r in runs] == [(False, ["v"])]
        assert "not saved: /lost (5000 bytes)" in m.log()
    info = json.loads(casfs(store, "volume", "info", "v", "--json").stdout)
    assert info["unsaved"]["unsaved"] == [["/lost", 5000]]
    assert "could not save /lost (5000 bytes)" in casfs(store, "volume", "info", "v").stdout
    done = casfs(store, "mount", mnt, "--volume", "v")
    try:
        assert done.returncode == 0, done.stderr
        assert "warning: volume v:" in done.stderr and "/lost" in done.stderr
        assert (mnt / "saved").read_bytes() == b"safe"
    finally:
        assert casfs(store, "umount", mnt).returncode == 0
    # a clean unmount clears the note
    assert json.loads(casfs(store, "volume", "info", "v", "--json").stdout)["unsaved"] is None


def test_a_forced_unmount_whose_snapshot_fails_loses_nothing(store: Path, tmp_path: Path) -> None:
    """Issue 7, defect 3, since files live in upper files: fusermount3 -u while the
    store refuses new blobs. The final flush needs none (it commits the rows naming the
    upper files), so every change is saved; the unmount's snapshot needs blobs and
    fails. The daemon exits non-zero and says so, nothing is recorded as lost, the next
    mount reads every change, and its unmount takes the snapshot."""
    mnt = tmp_path / "mnt"
    with running(store, mnt, volume="v") as m:
        (mnt / "saved").write_bytes(b"safe")
        fsync(mnt / "saved")
        (mnt / "lost").write_bytes(b"x" * 5000)  # never fsynced: the final flush saves it
        with blobs_refused(store):
            assert run(["fusermount3", "-u", mnt]).returncode == 0
            assert wait_gone(m.pid, m.proc, 30)
        assert m.proc is not None and m.proc.returncode == 1
        runs = [json.loads(p.read_text()) for p in (store / "run").glob("*.json")]
        assert [(r["clean"], r["unsaved"], r["unsnapshotted"]) for r in runs] == [(True, [], ["v"])]
        assert "the snapshot at unmount failed; every change is saved" in m.log()
        assert "not saved" not in m.log()
    info = json.loads(casfs(store, "volume", "info", "v", "--json").stdout)
    assert info["unsaved"] is None and info["snapshots"] == []
    done = casfs(store, "mount", mnt, "--volume", "v")
    try:
        assert done.returncode == 0, done.stderr
        assert (mnt / "saved").read_bytes() == b"safe"
        assert (mnt / "lost").read_bytes() == b"x" * 5000
    finally:
        out = casfs(store, "umount", mnt)
        assert out.returncode == 0, out.stderr
    assert "snapshot v@1" in out.stdout
    casfs(store, "snapshot", "export", "v@1", tmp_path / "v1")
    assert (tmp_path / "v1" / "lost").read_bytes() == b"x" * 5000


def test_a_snapshot_waiting_for_a_job_slot_does_not_stall_writers(store: Path, tmp_path: Path) -> None:
    """Issue 7, defect 10: other processes' jobs hold every slot; a snapshot asked by
    setfattr waits for one, and meanwhile writes and fsyncs to the volume go on.

    The kernel holds the root's inode lock for as long as a setxattr on the root runs:
    a name in the root it has no dentry for (a create, or one whose dentry memory
    pressure reclaimed) is looked up under that lock and waits for the snapshot. So the
    writer opens its file before, as a guest's disk or a container's files are; the
    file is made in an earlier mount, so this mount has no dentry of it cached (a path
    opened during the wait stalls here every time, and did under load before)."""
    with mounted(store, tmp_path / "mnt", volume="v") as m:
        (m.path / "f").write_bytes(b"")
    with contextlib.closing(Repository.open(store)) as repo:
        slots = [acquire_slot(repo, "someone else's import") for _ in range(queue_limit(repo))]

    def release_slots() -> None:
        for slot in slots:
            slot.release()

    with mounted(store, tmp_path / "mnt", volume="v") as m:
        fd = os.open(m.path / "f", os.O_WRONLY)
        snap = subprocess.Popen(["setfattr", "-n", "user.casfs.snapshot", "-v", "x", str(m.path)])
        dd: subprocess.Popen[bytes] | None = None
        try:
            deadline = time.monotonic() + 60
            while not list((store / "queue").glob("wait-*")) and time.monotonic() < deadline:
                assert snap.poll() is None, f"setfattr exited {snap.returncode}:\n{m.log()}"
                time.sleep(0.05)  # until the daemon queues for a slot
            assert list((store / "queue").glob("wait-*")), f"the snapshot never queued:\n{m.log()}"
            dd = subprocess.Popen(["dd", "if=/dev/urandom", "bs=64k", "count=16", "conv=fsync"], stdout=fd)
            with contextlib.suppress(subprocess.TimeoutExpired):
                dd.wait(timeout=60)  # (on time-out the slots are released first, or it never returns)
            stalled = dd.returncode is None
            release_slots()
            assert dd.wait(timeout=60) == 0
            assert not stalled, f"a write waited for the snapshot's job slot:\n{m.log()}"
            assert snap.wait(timeout=60) == 0, m.log()
        finally:
            release_slots()
            for proc in (dd, snap):
                if proc is not None and proc.poll() is None:
                    proc.kill()  # (neither keeps the mount busy past the test)
                    proc.wait()
            os.close(fd)
        assert (m.path / "f").stat().st_size == 16 << 16
    with contextlib.closing(Repository.open(store)) as repo:
        labels = [s.label for s in volumes.list_snapshots(repo, "v")]
    assert labels[:2] == [None, "x"]  # (v@1: the first unmount's)


# -- a real full disk ------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(tmp_path: Path, mib: int = 48) -> Iterator[Path]:
    """A small ext4 filesystem on a loop device, mounted at tmp_path/disk."""
    image, point = tmp_path / "disk.img", tmp_path / "disk"
    with open(image, "wb") as f:
        f.truncate(mib << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    with kernel_mounted(point, "-o", "loop", image):
        yield point


def new_store(store: Path) -> Repository:
    """A store made as a user makes one (`casfs init`: with its reserve), open."""
    made = casfs(store, "init")
    assert made.returncode == 0, made.stderr
    return Repository.open(store)


def fill(path: Path) -> None:
    """Fill the filesystem holding `path` (a file of that name takes every free block:
    0 bytes are left, for root too)."""
    with open(path, "wb", buffering=0) as f:
        for chunk in (b"\xff" * (1 << 20), b"\xff" * 4096):
            with contextlib.suppress(OSError):
                while True:
                    f.write(chunk)
        with contextlib.suppress(OSError):
            os.fsync(f.fileno())


def test_a_full_disk_is_enospc_and_nothing_acknowledged_is_lost(tmp_path: Path) -> None:
    with small_disk(tmp_path) as disk:
        store = disk / "store"
        with contextlib.closing(new_store(store)) as repo:
            volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
        mnt = tmp_path / "mnt"
        kept = os.urandom(200_000)
        with mounted(store, mnt, volume="v") as m:
            (m.path / "kept").write_bytes(kept)
            fsync(m.path / "kept")
            fill(disk / "filler")
            later = os.urandom(2_000_000)
            # With passthrough the kernel writes the new file's upper file itself: the
            # write fails at once, as ext4's would; through the daemon (the writeback
            # cache) it is kept in memory and the fsync fails.
            kernel = os.getxattr(m.path, "user.casfs.passthrough") == b"on"
            if kernel:
                with pytest.raises(OSError) as failed:
                    (m.path / "later").write_bytes(later)
            else:
                (m.path / "later").write_bytes(later)
                with pytest.raises(OSError) as failed:
                    fsync(m.path / "later")
            assert failed.value.errno == errno.ENOSPC
            gc = casfs(store, "gc")  # the store lock is not leaked: gc can run
            assert gc.returncode == 0, gc.stderr
            (disk / "filler").unlink()
            if kernel:
                (m.path / "later").write_bytes(later)
            fsync(m.path / "later")
        with mounted(store, mnt, volume="v") as m:
            assert (m.path / "kept").read_bytes() == kept
            assert (m.path / "later").read_bytes() == later
        fsck_clean(store)  # here: the small disk is gone when the test ends


def test_a_block_volume_on_a_full_disk_refuses_the_write_and_loses_nothing(tmp_path: Path) -> None:
    """A block volume writes into its upper file on the store's disk: a write the full
    disk refuses fails at once with ENOSPC (an O_DIRECT guest's write, acknowledged by
    nothing), what fsync acknowledged before stays, and writes go on once there is room."""
    mib = 1 << 20
    with small_disk(tmp_path) as disk:
        store = disk / "store"
        with contextlib.closing(new_store(store)) as repo:
            volumes.create_volume(repo, "b", volumes.Source(blank_block=16 * mib))
        image = tmp_path / "b.raw"
        image.touch()
        kept, refused, later = os.urandom(mib), os.urandom(4 * mib), os.urandom(mib)
        with mounted(store, image, volume="b"):
            fd = os.open(image, os.O_RDWR | os.O_DIRECT)
            try:
                buf = mmap.mmap(-1, 4 * mib)  # page-aligned, as O_DIRECT wants
                buf[:mib] = kept
                assert os.pwritev(fd, [memoryview(buf)[:mib]], 0) == mib
                os.fsync(fd)
                fill(disk / "filler")
                buf[:] = refused
                with pytest.raises(OSError) as failed:
                    os.pwritev(fd, [buf], 8 * mib)
                assert failed.value.errno == errno.ENOSPC
                (disk / "filler").unlink()
                buf[:mib] = later
                assert os.pwritev(fd, [memoryview(buf)[:mib]], 2 * mib) == mib
                os.fsync(fd)
            finally:
                os.close(fd)
        with mounted(store, image, volume="b"):
            got = image.read_bytes()
        assert got[:mib] == kept and got[2 * mib : 3 * mib] == later
        for at in range(0, 4 * mib, 4096):  # a refused write leaves each block old or new
            assert got[8 * mib + at : 8 * mib + at + 4096] in (bytes(4096), refused[at : at + 4096])
        fsck_clean(store)


def test_umount_on_a_full_disk_refuses_and_says_to_free_space(tmp_path: Path) -> None:
    """Issue 32: the refusal names the error (ENOSPC) and, for a full disk only, says to
    free space; once there is room, the unmount saves everything."""
    with small_disk(tmp_path) as disk:
        store = disk / "store"
        with contextlib.closing(new_store(store)) as repo:
            volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
        mnt = tmp_path / "mnt"
        data = os.urandom(2_000_000)
        with running(store, mnt, volume="v") as m:
            fill(disk / "filler")
            (mnt / "unsynced").write_bytes(data)  # no fsync: kept in the daemon's memory
            done = casfs(store, "umount", mnt)
            assert done.returncode == 1, done
            assert "ENOSPC (No space left on device)" in done.stderr, done.stderr
            assert "free space in the store" in done.stderr
            assert len(done.stderr.strip().splitlines()) == 1
            assert is_mounted(mnt)
            (disk / "filler").unlink()
            done = casfs(store, "umount", mnt)
            assert done.returncode == 0, done.stderr
            assert wait_gone(m.pid, m.proc, 30)
        with mounted(store, mnt, volume="v") as m:
            assert (m.path / "unsynced").read_bytes() == data
        fsck_clean(store)  # here: the small disk is gone when the test ends


def test_import_on_a_full_disk_says_so_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """Issue 7, defect 2: ENOSPC is reported as such (not 'Directory not empty'), exit 1,
    the staging directory is emptied and the store's lock is released."""
    source = tmp_path / "disk.raw"
    source.write_bytes(os.urandom(8 << 20))
    with small_disk(tmp_path) as disk:
        store = disk / "store"
        new_store(store).close()
        fill(disk / "filler")
        done = casfs(store, "image", "import", "big", source)
        assert done.returncode == 1, done
        assert "No space left on device" in done.stderr and "Directory not empty" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert list((store / "tmp").iterdir()) == []
        (disk / "filler").unlink()
        gc = casfs(store, "gc")
        assert gc.returncode == 0, gc.stderr
        again = casfs(store, "image", "import", "big", source)
        assert again.returncode == 0, again.stderr
        fsck_clean(store)  # here: the small disk is gone when the test ends


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_rm_and_gc_free_space_on_a_disk_with_0_bytes_free(tmp_path: Path) -> None:
    """Issue 32: with not a byte left, `volume rm`, `image rm` and `gc` (which failed
    with "database or disk is full") work, by the store's reserve, and free the space;
    gc makes the reserve again once there is room. Commands that need room say so in
    one line, never "unexpected"."""
    source = tmp_path / "src"
    for i in range(2000):  # (many blobs: each SQLite file's WAL grows with them)
        (source / f"{i % 20}").mkdir(parents=True, exist_ok=True)
        (source / f"{i % 20}" / f"f{i}").write_bytes(os.urandom(1000 + i % 3000))
    raw = tmp_path / "disk.raw"
    raw.write_bytes(os.urandom(8 << 20))
    with small_disk(tmp_path, mib=64) as disk:
        store = disk / "store"
        new_store(store).close()
        assert (store / "reserve").stat().st_size == 16 << 20
        for name, src in (("files", source), ("disk", raw)):
            assert casfs(store, "image", "import", name, src).returncode == 0
            assert casfs(store, "volume", "create", f"v-{name}", "--from", name).returncode == 0
        (store / "reserve.part").write_bytes(bytes(1 << 20))  # (as a crash in the making of one leaves)
        fill(disk / "filler")
        assert _free(disk) == 0
        (tmp_path / "mnt").mkdir()
        for cmd in (
            ("volume", "create", "more", "--blank-dir"),
            ("mount", tmp_path / "mnt", "--volume", "v-files"),
        ):
            refused = casfs(store, *cmd)
            assert refused.returncode == 1, refused
            assert "No space left on device" in refused.stderr and "unexpected" not in refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 1
        assert not is_mounted(tmp_path / "mnt")
        for rm in (("volume", "rm", "v-files"), ("volume", "rm", "v-disk"), ("image", "rm", "files")):
            done = casfs(store, *rm)
            assert done.returncode == 0, (rm, done.stderr)
        assert not (store / "reserve").exists()  # (given up by the first rm)
        assert not (store / "reserve.part").exists()
        done = casfs(store, "image", "rm", "disk")
        assert done.returncode == 0, done.stderr
        killed = casfs(store, "gc", CASFS_FAULT="gc:after-commit")  # kill -9 between a commit and its deletes
        assert killed.returncode == -signal.SIGKILL, killed
        gc = casfs(store, "gc")
        assert gc.returncode == 0, gc.stderr
        assert _free(disk) > 8 << 20, gc.stdout  # the images' blobs are gone
        fsck_clean(store)
        (disk / "filler").unlink()
        assert casfs(store, "gc").returncode == 0
        assert (store / "reserve").stat().st_size == 16 << 20  # made again: there is room
        for size, held in (("4M", 4 << 20), ("0", 0)):  # (the setting: its size, or none)
            assert casfs(store, "config", "set", "store.reserve", size).returncode == 0
            assert casfs(store, "gc").returncode == 0
            reserve = store / "reserve"
            assert (reserve.stat().st_size if reserve.exists() else 0) == held
        assert "expected a size" in casfs(store, "config", "set", "store.reserve", "lots").stderr
        fsck_clean(store)  # here: the small disk is gone when the test ends
