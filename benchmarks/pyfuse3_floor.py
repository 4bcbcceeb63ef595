#!/usr/bin/env python3
"""The floor of a Python FUSE daemon here: a passthrough of a directory in pyfuse3 and
trio, as casfs's daemon uses them, with nothing of casfs in it but its wait for requests.

    python benchmarks/pyfuse3_floor.py SOURCE MOUNTPOINT [--stock-wait]
                                               (foreground; fusermount3 -u ends it)

Every request is one or two system calls on SOURCE, made on the trio thread; inodes are
the source's, paths are remembered per inode (enough for benchmarks: a renamed directory's
children keep their old paths). Mount options and timeouts are casfs's for a read/write
volume (default_permissions, the kernel's writeback cache, 300 s entry and attribute
timeouts), so `dir_bench.py` can put casfs beside what the same stack costs with no work
at all: a figure casfs cannot beat, and how far bindfs (C, libfuse) is beyond it.
It waits for requests as casfs's daemon does (casfs.fuse.fastwait); --stock-wait keeps
pyfuse3's own wait, to measure what that costs.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pyfuse3
import trio

TIMEOUT = 300.0
T = TypeVar("T")


def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return fn(*args, **kwargs)
    except OSError as e:
        raise pyfuse3.FUSEError(e.errno or errno.EIO) from None


class Passthrough(pyfuse3.Operations):
    enable_writeback_cache = True

    def __init__(self, source: str) -> None:
        super().__init__()
        self.paths: dict[int, str] = {pyfuse3.ROOT_INODE: source}
        self.root_ino = os.lstat(source).st_ino
        self.dirs: dict[int, str] = {}
        self.next_fh = 1

    def _ino(self, st_ino: int) -> int:
        return pyfuse3.ROOT_INODE if st_ino == self.root_ino else st_ino

    def _entry(self, path: str) -> pyfuse3.EntryAttributes:
        st = _call(os.lstat, path)
        e = pyfuse3.EntryAttributes()
        for name in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size", "st_blocks"):
            setattr(e, name, getattr(st, name))
        e.st_ino = self._ino(st.st_ino)
        e.st_atime_ns, e.st_mtime_ns, e.st_ctime_ns = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        e.st_blksize = 4096
        e.entry_timeout = e.attr_timeout = TIMEOUT
        self.paths[e.st_ino] = path
        return e

    def _child(self, parent: int, name: bytes) -> str:
        return os.path.join(self.paths[parent], os.fsdecode(name))

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        return self._entry(self._child(parent_inode, name))

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._entry(self.paths[inode])

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        path = self.paths[inode]
        if fields.update_size:
            _call(os.truncate, path, attr.st_size)
        if fields.update_mode:
            _call(os.chmod, path, attr.st_mode & 0o7777)
        if fields.update_uid or fields.update_gid:
            uid = attr.st_uid if fields.update_uid else -1
            gid = attr.st_gid if fields.update_gid else -1
            _call(os.chown, path, uid, gid, follow_symlinks=False)
        if fields.update_atime or fields.update_mtime:
            st = _call(os.lstat, path)
            atime = attr.st_atime_ns if fields.update_atime else st.st_atime_ns
            mtime = attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns
            _call(os.utime, path, ns=(atime, mtime), follow_symlinks=False)
        return self._entry(path)

    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return os.fsencode(_call(os.readlink, self.paths[inode]))

    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        _call(os.mknod, path, mode, rdev)
        return self._owned(path, ctx)

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        _call(os.mkdir, path, mode)
        return self._owned(path, ctx)

    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        _call(os.symlink, target, path)
        return self._owned(path, ctx)

    def _owned(self, path: str, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        _call(os.chown, path, ctx.uid, ctx.gid, follow_symlinks=False)
        return self._entry(path)

    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._child(new_parent_inode, new_name)
        _call(os.link, self.paths[inode], path)
        return self._entry(path)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        _call(os.unlink, self._child(parent_inode, name))

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        _call(os.rmdir, self._child(parent_inode, name))

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        if flags:
            raise pyfuse3.FUSEError(errno.EINVAL)
        new = self._child(parent_inode_new, name_new)
        _call(os.rename, self._child(parent_inode_old, name_old), new)
        self.paths[self._ino(os.lstat(new).st_ino)] = new

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        # The writeback cache reads pages of write-only files too.
        if flags & os.O_ACCMODE == os.O_WRONLY:
            flags = flags & ~os.O_ACCMODE | os.O_RDWR
        fd = _call(os.open, self.paths[inode], flags & ~os.O_APPEND)
        return pyfuse3.FileInfo(fh=fd)

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = self._child(parent_inode, name)
        flags = flags & ~(os.O_ACCMODE | os.O_APPEND) | os.O_RDWR | os.O_CREAT
        fd = _call(os.open, path, flags, mode)
        _call(os.fchown, fd, ctx.uid, ctx.gid)
        return pyfuse3.FileInfo(fh=fd), self._entry(path)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return _call(os.pread, fh, size, off)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return _call(os.pwrite, fh, buf, off)

    async def flush(self, fh: int) -> None:
        raise pyfuse3.FUSEError(errno.ENOSYS)  # (as casfs: one request less per close)

    async def release(self, fh: int) -> None:
        os.close(fh)

    async def fsync(self, fh: int, datasync: bool) -> None:
        _call(os.fdatasync if datasync else os.fsync, fh)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        fh, self.next_fh = self.next_fh, self.next_fh + 1
        self.dirs[fh] = self.paths[inode]
        return fh

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        names = sorted(_call(os.listdir, self.dirs[fh]))
        for i in range(start_id, len(names)):
            entry = self._entry(os.path.join(self.dirs[fh], names[i]))
            if not pyfuse3.readdir_reply(token, os.fsencode(names[i]), entry, i + 1):
                return

    async def releasedir(self, fh: int) -> None:
        self.dirs.pop(fh, None)

    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        return _call(os.getxattr, self.paths[inode], name, follow_symlinks=False)

    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        _call(os.setxattr, self.paths[inode], name, value, follow_symlinks=False)

    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        return [os.fsencode(n) for n in _call(os.listxattr, self.paths[inode], follow_symlinks=False)]

    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        _call(os.removexattr, self.paths[inode], name, follow_symlinks=False)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        pass  # (paths stay: a benchmark's tree is small enough)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        st = os.statvfs(self.paths[pyfuse3.ROOT_INODE])
        out = pyfuse3.StatvfsData()
        for name in (
            "f_bsize",
            "f_frsize",
            "f_blocks",
            "f_bfree",
            "f_bavail",
            "f_files",
            "f_ffree",
            "f_favail",
            "f_namemax",
        ):
            setattr(out, name, getattr(st, name))
        return out


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from casfs.fuse import fastwait

    source, mountpoint = sys.argv[1:3]
    pyfuse3.init(
        Passthrough(os.path.abspath(source)), mountpoint, {"fsname=pyfuse3-floor", "default_permissions"}
    )
    wait = contextlib.nullcontext(False) if "--stock-wait" in sys.argv[3:] else fastwait.installed()
    try:
        with wait:
            trio.run(functools.partial(pyfuse3.main, min_tasks=32))  # (casfs's daemon's loop)
    finally:
        pyfuse3.close(unmount=False)


if __name__ == "__main__":
    main()
