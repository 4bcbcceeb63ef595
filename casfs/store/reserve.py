"""STORE/reserve: room the store keeps on its disk for the commands that free space.

A disk filled to its last byte stops SQLite too: deleting a row writes the WAL first,
and opening a catalog whose last user closed it creates its -shm and -wal files. So
`casfs volume rm`, `image rm` and `gc`, the remedy for a full disk, failed with
"database or disk is full" exactly when they were needed (issue 32). The store keeps
a file of allocated blocks nothing else uses; a command that frees space removes it
before it opens the catalog when the disk has less free room than the file holds, and
`casfs gc` makes it again once twice its size is free. It holds no data: a crash
anywhere (even between its fallocate and its rename) loses nothing.

How much is needed, measured on small ext4 disks filled to 0 bytes, then `volume rm`,
`image rm` and `gc` of what one image held (2026-12-02): an 8 MiB raw image (257 blobs)
failed with 1 and 2 MiB released and worked with 4; a 20,000-file image failed with 4
and 8 MiB and worked with 16. Each SQLite file's WAL grows to its autocheckpoint (1000
pages, ~4 MiB) before it wraps, the catalog's and the pack index's both, and a closed
one starts again from nothing; pack files free their room only once all their blobs
are gone. Hence DEFAULT_BYTES, and `casfs config set store.reserve SIZE` (0: none).
A 100,000-file image (101,001 blobs) failed with the 16 MiB: one gc transaction of
50,000 decrements wrote a 10 MB WAL; so gc on a disk short of room (short_of_room)
runs in small rounds (refcount.gc.SMALL_ROUND_*), and then it worked.
"""

from __future__ import annotations

import contextlib
import os

NAME = "reserve"
DEFAULT_BYTES = 16 << 20


def free_bytes(root: str | os.PathLike[str]) -> int:
    """What an unprivileged writer may still take on root's filesystem."""
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize


def short_of_room(root: str | os.PathLike[str], size: int) -> bool:
    """Whether the disk has less free than keep() wants for a reserve of `size` (at
    least the default's: a store without one is short of room all the same)."""
    return free_bytes(root) < 2 * max(size, DEFAULT_BYTES)


def release_if_full(root: str | os.PathLike[str]) -> bool:
    """Remove the reserve if the disk has less free room than it holds; whether it did.
    (A part-made one left by a crash in keep() goes too, whatever the room.)"""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(root, f"{NAME}.part"))
    path = os.path.join(root, NAME)
    try:
        held = os.stat(path).st_size
        if free_bytes(root) >= held:
            return False
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def keep(root: str | os.PathLike[str], size: int) -> bool:
    """Make the reserve `size` bytes (0: have none) if that leaves as much free again;
    whether it is in place. Written aside and renamed in: never a part-made one."""
    path = os.path.join(root, NAME)
    try:
        held = os.stat(path).st_size
    except FileNotFoundError:
        held = 0
    if held == size:
        return True
    if size == 0:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True
    if free_bytes(root) + held < 2 * size:
        return False
    part = os.path.join(root, f"{NAME}.part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)  # (allocated blocks: a sparse file would hold nothing)
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(part)
        return False
    finally:
        os.close(fd)
    try:
        os.rename(part, path)
    except FileNotFoundError:  # (a freeing command took it meanwhile: the disk is short)
        return False
    return True
