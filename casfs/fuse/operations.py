"""The pyfuse3 Operations adapter: FUSE inodes and EntryAttributes in, one call into a
view, FUSEError out. No SQL, hashing or zstd here (borg's fuse.py is the model).

Every handler is wrapped by @handler, so only FUSEError reaches pyfuse3: a CasfsError
or OSError becomes its errno, anything else is logged with its traceback and answered
EIO (an exception escaping pyfuse3.main() would leave the mount hung).

Threading: handlers run on the trio thread and call views there (views only touch
memory and small cached metadata). Chunk reads that miss the cache go to worker
threads; cached chunks are served inline. A read/write view (casfs.vfs.api.RwView, which
`view.rw` returns) is changed through casfs.fuse.rwsession: its lock, the NeedChunks
retry, flushes and snapshots. The protocol: docs/concurrency.md.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import stat
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import pyfuse3
import trio
from pyfuse3 import FileHandleT, FileNameT, FlagT, FUSEError, InodeT, ModeT, RequestContext, XAttrNameT

from casfs import metrics
from casfs.errors import CasfsError, Corruption, ReadOnly, of_database
from casfs.fuse import control as ctl
from casfs.fuse import killpriv, passthrough, rwsession, upperpass
from casfs.fuse.inodes import ROOT, InodeTable
from casfs.fuse.replybuf import ReplyBuffer
from casfs.ids import InodeNo
from casfs.store.filecache import FillProgress
from casfs.store.ids import ZERO_ID
from casfs.vfs.api import ROOT_INO, ZEROS, Fetched, Names, RwView, Stat, View, assemble_into
from casfs.vfs.chunks import ChunkCache
from casfs.vfs.plan import Planner
from casfs.vfs.storeview import Subject, entries, resolve

log = logging.getLogger(__name__)

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND
# Dirty data a read/write view may buffer before a write waits for a flush.
DIRTY_LIMIT_BYTES = 64 << 20

_STATFS_TTL_S = 2.0

_KERNEL_MTIMES = 8  # the mtimes of a block file's entries remembered (Operations._kernel_mtime_restated)
# What a setattr may change: (SetattrFields flag, the view's name, EntryAttributes field)
_SETATTR = tuple(
    (f"update_{flag}", key, f"st_{key}")
    for flag, key in (
        ("mode", "mode"),
        ("uid", "uid"),
        ("gid", "gid"),
        ("size", "size"),
        ("atime", "atime_ns"),
        ("mtime", "mtime_ns"),
    )
)

P = ParamSpec("P")
R = TypeVar("R")
Self = TypeVar("Self", bound="Operations")


Handler = Callable[Concatenate[Self, P], Coroutine[Any, Any, R]]


def handler(fn: Handler[Self, P, R]) -> Handler[Self, P, R]:
    """Only FUSEError may leave a handler. With metrics on, each request is counted and
    timed under its handler's name (casfs.metrics)."""
    op = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: Self, *args: P.args, **kwargs: P.kwargs) -> R:
        counts = metrics.counts
        start = time.perf_counter() if counts is not None else 0.0
        try:
            return await fn(self, *args, **kwargs)
        except FUSEError:
            raise
        except CasfsError as e:
            if isinstance(e, Corruption):
                log.error("%s: %s", fn.__name__, e)
            raise FUSEError(e.errno) from None
        except OSError as e:
            raise FUSEError(e.errno or errno.EIO) from None
        except Exception as e:
            mapped = of_database(e)  # (a full or locked catalog: ENOSPC, EBUSY, not EIO)
            if mapped is not None:
                log.error("%s: %s", fn.__name__, mapped)
                raise FUSEError(mapped.errno) from None
            log.exception("unexpected error in %s(%s)", fn.__name__, _shown(fn.__name__, args))
            raise FUSEError(errno.EIO) from None
        finally:
            if counts is not None:
                counts.request(op, time.perf_counter() - start)

    return wrapper  # type: ignore[return-value]  # functools' _Wrapped is this callable


def _shown(handler: str, args: tuple[object, ...]) -> str:
    """A handler's arguments for a log line, its data left out: a write's buffer, and
    any bytes longer than a name (an xattr's value), are shown as their length."""
    parts = []
    for arg in args:
        if isinstance(arg, bytes | bytearray | memoryview) and (handler == "write" or len(arg) > 255):
            parts.append(f"<{len(arg)} bytes>")
        else:
            parts.append(repr(arg))
    return ", ".join(parts)


@dataclass
class MountOptions:
    mountpoint: str
    store: str
    read_only: bool = False  # --ro: every mutation is EROFS
    owner_uid: int = 0
    # Immutable content (images, snapshots) keeps long timeouts; the rest stays fresh.
    immutable_timeout: float = 300.0
    mutable_timeout: float = 1.0
    blksize: int = 1 << 16
    dirty_limit_bytes: int = DIRTY_LIMIT_BYTES


@dataclass
class _Handle:
    view: View
    ino: InodeNo
    fino: int
    # Reads through it are accesses (relatime): opened for reading, without O_NOATIME.
    # (A write-only handle is read by the kernel itself, for writeback's partial pages.)
    atime: bool = False
    direct: bool = False  # opened with direct I/O (no page cache)
    backing: bool = False  # opened with a backing file: the kernel reads it, not us
    writer: bool = False  # (a backed handle) opened for writing: the kernel writes it too
    # A file being filled into passthrough's cache: what the fill has written is read there.
    filling: FillProgress | None = None
    # Made once here, not for every read: the read-ahead stream's key, its planner, and
    # what to tell of an access (None: no atime to keep).
    stream: tuple[int, InodeNo] = field(init=False)
    plan: Planner = field(init=False)
    accessed: Callable[[InodeNo], None] | None = field(init=False)

    def __post_init__(self) -> None:
        self.stream = (id(self.view), self.ino)
        self.plan = functools.partial(self.view.read_plan, self.ino)
        rw = self.view.rw
        self.accessed = rw.accessed if self.atime and rw is not None else None


class Operations(pyfuse3.Operations):
    # Read by casfs's pyfuse3 build at INIT: ask the kernel for passthrough, and to
    # leave clearing setuid/setgid to the daemon (casfs.fuse.killpriv).
    enable_passthrough = False
    enable_killpriv_v2 = False

    def __init__(
        self,
        table: InodeTable,
        chunks: ChunkCache,
        controls: ctl.ControlPlane,
        options: MountOptions,
        subject: Callable[[View], Subject | None],
    ) -> None:
        super().__init__()
        self.table = table
        self.chunks = chunks
        self.controls = controls
        self.opts = options
        self.subject = subject
        self._handles: dict[int, _Handle] = {}
        self._fh = itertools.count(1)
        self._statfs: tuple[float, pyfuse3.StatvfsData] | None = None
        # Block files written through direct handles: the kernel's pages of them may be old.
        self._stale: dict[tuple[View, InodeNo], bool] = {}
        # The mtimes the kernel may hold of each block volume's file it holds under the
        # writeback cache, newest last (_kernel_mtime_restated).
        self._kernel_mtimes: dict[int, list[int]] = {}
        self._reply = ReplyBuffer()
        # Opens answered with a backing file, where the kernel granted passthrough at
        # INIT; `on_init` (the daemon's) sets it then.
        self.passthrough: passthrough.PassthroughOpens | None = None
        self.killpriv = False  # the kernel left clearing set-id bits to us (at INIT)
        self.on_init: Callable[[], None] | None = None

    def init(self) -> None:
        self.killpriv = killpriv.granted()
        if self.on_init is not None:
            self.on_init()

    # -- attributes --------------------------------------------------------------

    @staticmethod
    def _stable(view: View) -> bool:
        """Whether the kernel may keep what it learns of the view: an image never changes,
        and a read/write volume changes only through this mount (its claim keeps rollback,
        resize and other mounts out), while the kernel drops what its own requests change.
        Only the store's listing changes behind the kernel's back (the CLI's commands).
        (What the daemon itself moves later, an atime after reads, st_blocks after a
        fold, may show its old value until the kernel asks again: up to the timeout.)"""
        return view.immutable or view.rw is not None

    def _timeout(self, view: View) -> float:
        return self.opts.immutable_timeout if self._stable(view) else self.opts.mutable_timeout

    def _attrs(self, st: Stat, fino: int, view: View, parent: View | None = None) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = InodeT(fino)
        e.generation = 0
        e.attr_timeout = self._timeout(view)
        e.entry_timeout = min(e.attr_timeout, self._timeout(parent)) if parent is not None else e.attr_timeout
        e.st_mode = ModeT(st.mode)
        e.st_nlink = st.nlink
        e.st_uid = st.uid
        e.st_gid = st.gid
        e.st_rdev = st.rdev
        e.st_size = st.size
        e.st_blksize = self.opts.blksize
        e.st_blocks = st.blocks if st.blocks is not None else (st.size + 511) // 512
        e.st_atime_ns = st.atime_ns
        e.st_mtime_ns = st.mtime_ns
        e.st_ctime_ns = st.ctime_ns
        # An entry (a parent): the kernel may make its inode with it.
        entry = parent is not None and st.ino == ROOT_INO and self.enable_writeback_cache
        if entry and self._fixed_size(view, st.ino):
            self._kernel_may_hold(fino, st.mtime_ns)
        return e

    def _kernel_may_hold(self, fino: int, mtime_ns: int) -> None:
        held = self._kernel_mtimes.setdefault(fino, [])
        if mtime_ns not in held:
            held[:] = [*held[-(_KERNEL_MTIMES - 1) :], mtime_ns]

    def _kernel_mtime_restated(self, fino: int, changes: dict[str, int]) -> bool:
        """Whether a SETATTR of a block volume's file only writes back an mtime the
        kernel holds. Under the writeback cache the kernel owns a regular file's times:
        it takes them once, from the entry with which it makes its inode, and sends them
        back (mtime and ctime) whenever the inode is dirtied (a setxattr, such as a
        snapshot's, updates its ctime). Its direct writes (every handle of a block volume
        here) never move them, so what it sends back is older than the writes: applied,
        the file's time would go back, and a changed attribute would make the next
        snapshot a fold. Which entry made the inode is not known for sure (a FORGET may
        come after the next LOOKUP): the last few entries' mtimes count, and each mtime
        a SETATTR sets (the kernel holds it too: sent back again, it changes nothing)."""
        held = self._kernel_mtimes.get(fino)
        if held is None or "mtime_ns" not in changes:
            return False
        restated = changes.keys() == {"mtime_ns"} and changes["mtime_ns"] in held
        self._kernel_may_hold(fino, changes["mtime_ns"])
        return restated

    def _writable(self, view: View) -> RwView:
        rw = view.rw
        if self.opts.read_only or view.read_only or rw is None:
            raise ReadOnly(f"{view.describe(ROOT_INO)} is read-only")
        rw.ensure_writable()  # the first change claims the volume (Busy: another process has it)
        return rw

    def _entry_reply(self, view: View, st: Stat, parent: View) -> pyfuse3.EntryAttributes:
        """A new entry the kernel now holds: one lookup."""
        return self._attrs(st, self.table.ref(view, st.ino), view, parent)

    def _mutate(self, view: View, change: Callable[[RwView, Fetched], R]) -> Coroutine[Any, Any, R]:
        """Run one change of a read/write view under its lock (rwsession.mutate; its
        coroutine, not one more around it: nearly every request of a tar -x is one)."""
        rw = self._writable(view)
        return rwsession.mutate(
            rw, functools.partial(change, rw), self.chunks.fetch_async, self.opts.dirty_limit_bytes
        )

    async def _make(
        self, parent_inode: InodeT, make: Callable[[RwView, InodeNo], Stat]
    ) -> pyfuse3.EntryAttributes:
        """A new entry in a directory: made under the lock, then held by the kernel."""
        view, ino = self.table.get(parent_inode)
        st = await self._mutate(view, lambda rw, _: make(rw, ino))
        return self._entry_reply(view, st, view)

    async def flush_aged(self, views: Sequence[RwView], age_s: float) -> None:
        """Flush read/write views whose oldest unflushed change is older than age_s
        (the daemon calls this on a timer)."""
        await rwsession.flush_aged(views, age_s)

    # -- lookups and attributes --------------------------------------------------

    @handler
    async def lookup(
        self, parent_inode: InodeT, name: FileNameT, ctx: RequestContext
    ) -> pyfuse3.EntryAttributes:
        view, ino = self.table.get(parent_inode)
        try:
            child, cino, st = resolve(view, ino, name)
        except OSError as e:
            if e.errno != errno.ENOENT or not self._stable(view):
                raise
            # The kernel may remember that a name is missing (it forgets when it creates
            # one): a program probing paths (an interpreter's imports, the dynamic
            # loader, $PATH) asks once, not each time.
            missing = pyfuse3.EntryAttributes()
            missing.st_ino = InodeT(0)
            missing.entry_timeout = self._timeout(view)
            return missing
        return self._attrs(st, self.table.ref(child, cino), child, view)

    @handler
    async def forget(self, inode_list: Sequence[tuple[InodeT, int]]) -> None:
        for fino, n in inode_list:
            self.table.forget(fino, n)
            if fino in self._kernel_mtimes and not self.table.held(fino):
                del self._kernel_mtimes[fino]

    @handler
    async def getattr(self, inode: InodeT, ctx: RequestContext) -> pyfuse3.EntryAttributes:
        view, ino = self.table.get(inode)
        return self._attrs(view.getattr(ino), inode, view)

    @handler
    async def setattr(
        self,
        inode: InodeT,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: FileHandleT | None,
        ctx: RequestContext,
    ) -> pyfuse3.EntryAttributes:
        view, ino = self.table.get(inode)
        changes = {key: getattr(attr, st) for flag, key, st in _SETATTR if getattr(fields, flag)}
        if self._kernel_mtime_restated(inode, changes):
            return self._attrs(view.getattr(ino), inode, view)
        drop = self.killpriv and killpriv.asked(fields, fh)
        if drop and not changes and not killpriv.would_clear(view.getattr(ino).mode):
            return self._attrs(view.getattr(ino), inode, view)  # (nothing to clear: no change)
        st = await self._mutate(
            view, lambda rw, fetched: rw.setattr(ino, **changes, drop_privileges=drop, fetched=fetched)
        )
        return self._attrs(st, inode, view)

    @handler
    async def readlink(self, inode: InodeT, ctx: RequestContext) -> FileNameT:
        view, ino = self.table.get(inode)
        return FileNameT(view.readlink(ino))

    # -- namespace changes (read/write views only) -------------------------------

    @handler
    async def mknod(
        self, parent_inode: InodeT, name: FileNameT, mode: ModeT, rdev: int, ctx: RequestContext
    ) -> pyfuse3.EntryAttributes:
        return await self._make(
            parent_inode, lambda rw, ino: _names(rw).mknod(ino, name, mode, rdev, ctx.uid, ctx.gid)
        )

    @handler
    async def mkdir(
        self, parent_inode: InodeT, name: FileNameT, mode: ModeT, ctx: RequestContext
    ) -> pyfuse3.EntryAttributes:
        return await self._make(
            parent_inode, lambda rw, ino: _names(rw).mkdir(ino, name, mode, ctx.uid, ctx.gid)
        )

    @handler
    async def unlink(self, parent_inode: InodeT, name: FileNameT, ctx: RequestContext) -> None:
        view, ino = self.table.get(parent_inode)
        await self._mutate(view, lambda rw, _: _names(rw).unlink(ino, name))

    @handler
    async def rmdir(self, parent_inode: InodeT, name: FileNameT, ctx: RequestContext) -> None:
        view, ino = self.table.get(parent_inode)
        await self._mutate(view, lambda rw, _: _names(rw).rmdir(ino, name))

    @handler
    async def symlink(
        self, parent_inode: InodeT, name: FileNameT, target: FileNameT, ctx: RequestContext
    ) -> pyfuse3.EntryAttributes:
        return await self._make(
            parent_inode, lambda rw, ino: _names(rw).symlink(ino, name, target, ctx.uid, ctx.gid)
        )

    @handler
    async def rename(
        self,
        parent_inode_old: InodeT,
        name_old: FileNameT,
        parent_inode_new: InodeT,
        name_new: FileNameT,
        flags: FlagT,
        ctx: RequestContext,
    ) -> None:
        view, old = self.table.get(parent_inode_old)
        view_new, new = self.table.get(parent_inode_new)
        if view_new is not view:
            raise FUSEError(errno.EXDEV)
        await self._mutate(view, lambda rw, _: _names(rw).rename(old, name_old, new, name_new, flags))

    @handler
    async def link(
        self, inode: InodeT, new_parent_inode: InodeT, new_name: FileNameT, ctx: RequestContext
    ) -> pyfuse3.EntryAttributes:
        view, ino = self.table.get(inode)
        view_new, parent = self.table.get(new_parent_inode)
        if view_new is not view:
            raise FUSEError(errno.EXDEV)
        st = await self._mutate(view, lambda rw, _: _names(rw).link(ino, parent, new_name))
        return self._entry_reply(view, st, view)

    # -- files -------------------------------------------------------------------

    def _new_handle(self, view: View, ino: InodeNo, fino: int, flags: int) -> pyfuse3.FileInfo:
        fh = next(self._fh)
        atime = flags & os.O_ACCMODE != os.O_WRONLY and not flags & os.O_NOATIME
        # Immutable content keeps the kernel's page cache across opens. A writable block
        # volume under the kernel's writeback cache (volumes/NAME of a whole-store mount)
        # skips the page cache: that cache owns the file's size, so a write past the end
        # would grow it there and be lost when its writeback fails; direct, it is refused.
        # Where that cache is off (a block volume mounted on its file), its page cache stays
        # valid across opens, as an image's does: this mount is the volume's one writer, and
        # every write passes through it; an O_DIRECT opener gets direct I/O (_direct).
        fixed = self._fixed_size(view, ino)
        direct = fixed and (self.enable_writeback_cache or self._direct(view, ino, flags))
        keep = view.immutable or (fixed and not direct and not self._stale.pop((view, ino), False))
        self._handles[fh] = _Handle(view, ino, fino, atime, direct)
        return pyfuse3.FileInfo(fh=FileHandleT(fh), keep_cache=keep, direct_io=direct)

    def _direct(self, view: View, ino: InodeNo, flags: int) -> bool:
        """Whether a new handle of a block volume's file (no writeback cache) skips the
        page cache. An O_DIRECT opener (a hypervisor) asks the kernel for none anyway, and
        direct I/O spares each of its writes a second request: without it the kernel asks
        for `security.capability` before every write (to clear it), a whole round trip
        through this daemon, half the cost of a 4 KiB write (where the kernel did not
        grant KILLPRIV_V2: with it, it asks once per inode, casfs.fuse.killpriv).
        The page cache stays coherent:
        the handles open on the file are all direct or all cached (an O_DIRECT opener among
        cached ones stays cached, where the kernel drops the pages it writes over; any
        opener among direct ones is direct), and the first cached handle after direct
        writes drops what the kernel kept from before (no keep_cache). (A direct handle
        cannot be mapped shared: mmap of the file fails while an O_DIRECT opener has it.)"""
        others = [h.direct for h in self._handles.values() if h.view is view and h.ino == ino]
        direct = any(others) if others else bool(flags & os.O_DIRECT)
        if direct and flags & os.O_ACCMODE != os.O_RDONLY:
            self._stale[(view, ino)] = True
        return direct

    def _fixed_size(self, view: View, ino: InodeNo) -> bool:
        """A writable block volume's file: writes never change its size."""
        writable = not (self.opts.read_only or view.read_only)
        return writable and ino == ROOT_INO and view.rw is not None and view.rw.fixed_size

    @handler
    async def open(self, inode: InodeT, flags: FlagT, ctx: RequestContext) -> pyfuse3.FileInfo:
        view, ino = self.table.get(inode)
        if flags & _WRITE_FLAGS:
            self._writable(view)
        if flags & os.O_TRUNC:
            # libfuse asks for atomic O_TRUNC: the kernel sends no separate truncate.
            drop = (
                self.killpriv
                and killpriv.would_clear(view.getattr(ino).mode)
                and not killpriv.opener_may_keep(ctx.pid)
            )
            await self._mutate(
                view, lambda rw, fetched: rw.setattr(ino, size=0, drop_privileges=drop, fetched=fetched)
            )
        backed = await self._backed_handle(view, ino, inode, flags)
        if backed is not None:
            return backed
        served = self._new_handle(view, ino, inode, flags)
        if self.passthrough is not None and not flags & _WRITE_FLAGS and not self._upper_passed(view):
            self._handles[served.fh].filling = self.passthrough.filling(view, ino)
        return served

    def _upper_passed(self, view: View) -> bool:
        """Whether `view`'s backed opens are its upper files (a writable volume's)."""
        return upperpass.kind_of(view) is not None and not self.opts.read_only

    async def _backed_handle(
        self, view: View, ino: InodeNo, fino: int, flags: int
    ) -> pyfuse3.FileInfo | None:
        """A handle the kernel serves from a backing file (passthrough), or None."""
        opens = self.passthrough
        if opens is None:
            return None
        writer = bool(flags & _WRITE_FLAGS)
        served = functools.partial(self._served_open, view, ino)
        if self._upper_passed(view):
            backing = await upperpass.backing_id(opens, view, ino, writer, served, self._mutate)
        else:
            backing = 0 if writer else await opens.backing_id(view, ino, served)
        if not backing:
            return None
        if (counts := metrics.counts) is not None:
            counts.passed_through("upper" if self._upper_passed(view) else "cache")
        rw = view.rw
        if rw is not None and flags & os.O_ACCMODE != os.O_WRONLY and not flags & os.O_NOATIME:
            rw.accessed(ino)  # (the kernel's reads never reach the daemon: the open is the access)
        fh = next(self._fh)
        self._handles[fh] = _Handle(view, ino, fino, backing=True, writer=writer)
        return pyfuse3.FileInfo(fh=FileHandleT(fh), keep_cache=False, backing_id=backing)

    def _served_open(self, view: View, ino: InodeNo) -> bool:
        """Whether (view, ino) has a handle whose reads this daemon serves."""
        return any(h.view is view and h.ino == ino and not h.backing for h in self._handles.values())

    @handler
    async def create(
        self, parent_inode: InodeT, name: FileNameT, mode: ModeT, flags: FlagT, ctx: RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        view, ino = self.table.get(parent_inode)
        kind = stat.S_IFREG | stat.S_IMODE(mode)
        st: Stat = await self._mutate(
            view, lambda rw, _: _names(rw).mknod(ino, name, kind, 0, ctx.uid, ctx.gid)
        )
        attrs = self._entry_reply(view, st, view)
        backed = await self._backed_handle(view, st.ino, attrs.st_ino, flags)
        return backed if backed is not None else self._new_handle(view, st.ino, attrs.st_ino, flags), attrs

    @handler
    async def read(self, fh: FileHandleT, off: int, size: int) -> bytes:
        h = self._handles[fh]
        if h.filling is not None and (filled := h.filling.read(off, size)) is not None:
            return filled
        pieces = h.plan(off, size)
        chunks = self.chunks
        have, missing = chunks.split(pieces)
        if (counts := metrics.counts) is not None:
            counts.read_bytes += size
            counts.cache_hits += len(have)
            counts.cache_misses += len(missing)
        # Before any wait: a sequential reader's window is topped up while this waits.
        chunks.readahead(h.stream, off, size, h.plan)
        if missing:
            try:
                have.update(await chunks.fetch_async(missing))
            except Corruption as e:
                log.error("reading %s: %s", h.view.describe(h.ino), e)
                raise
        if h.accessed is not None:
            h.accessed(h.ino)
        if len(pieces) == 1 and (p := pieces[0]).data is None and p.read is None:
            # A small read (4 KiB): a view of its verified chunk, or of zeros for a hole,
            # not a copy into the reply buffer.
            data = ZEROS if p.blob == ZERO_ID else have.get(p.blob)
            if data is not None and len(data) >= p.end:
                return cast(bytes, memoryview(data)[p.start : p.end])
        # (pyfuse3 replies with any buffer; it writes this one before the next read runs)
        return cast(bytes, self._reply.fill(size, functools.partial(assemble_into, pieces, have.__getitem__)))

    @handler
    async def write(self, fh: FileHandleT, off: int, buf: bytes) -> int:
        h = self._handles[fh]
        written = int(await self._mutate(h.view, lambda rw, fetched: rw.write(h.ino, off, buf, fetched)))
        if (counts := metrics.counts) is not None:
            counts.written_bytes += written
        return written

    @handler
    async def flush(self, fh: FileHandleT) -> None:
        # close() makes nothing durable here (fsync does), and the kernel has written
        # its dirty pages before it asks. ENOSYS makes it stop asking: one request less
        # per close, for every file a `cp -a` or `tar -x` writes.
        raise FUSEError(errno.ENOSYS)

    @handler
    async def release(self, fh: FileHandleT) -> None:
        h = self._handles.pop(fh)
        self.chunks.forget_stream(h.stream)
        if h.backing and self.passthrough is not None:
            if self._upper_passed(h.view):
                await upperpass.release(self.passthrough, h.view, h.ino, h.writer, self._mutate)
            else:
                self.passthrough.release(h.view, h.ino)
        if h.filling is not None:
            h.filling.detach()

    @handler
    async def fsync(self, fh: FileHandleT, datasync: bool) -> None:
        h = self._handles[fh]
        if not (self.opts.read_only or h.view.read_only):
            if h.backing:
                await upperpass.fsync(h.view, h.ino)  # (the kernel's writes: only in the file)
            await rwsession.sync(h.view)

    # -- directories -------------------------------------------------------------

    @handler
    async def opendir(self, inode: InodeT, ctx: RequestContext) -> FileHandleT:
        view, ino = self.table.get(inode)
        fh = next(self._fh)
        self._handles[fh] = _Handle(view, ino, inode)
        return FileHandleT(fh)

    @handler
    async def readdir(self, fh: FileHandleT, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        h = self._handles[fh]
        for name, child, cino, st, nxt in entries(h.view, h.ino, start_id):
            attrs = self._attrs(st, self.table.fuse_ino(child, cino), child, h.view)
            if not pyfuse3.readdir_reply(token, FileNameT(name), attrs, nxt):
                self.table.release_unreferenced(child, cino)
                break
            self.table.ref(child, cino)

    @handler
    async def releasedir(self, fh: FileHandleT) -> None:
        self._handles.pop(fh, None)

    @handler
    async def fsyncdir(self, fh: FileHandleT, datasync: bool) -> None:
        await self.fsync(fh, datasync)  # one flush makes the whole view durable

    # -- the file system ---------------------------------------------------------

    @handler
    async def statfs(self, ctx: RequestContext) -> pyfuse3.StatvfsData:
        now = time.monotonic()
        if self._statfs is None or now - self._statfs[0] > _STATFS_TTL_S:
            vfs = await trio.to_thread.run_sync(os.statvfs, self.opts.store)
            s = pyfuse3.StatvfsData()
            s.f_bsize = s.f_frsize = vfs.f_frsize
            s.f_blocks, s.f_bfree, s.f_bavail = vfs.f_blocks, vfs.f_bfree, vfs.f_bavail
            s.f_files, s.f_ffree, s.f_favail = vfs.f_files, vfs.f_ffree, vfs.f_favail
            s.f_namemax = 255
            self._statfs = (now, s)
        return self._statfs[1]

    # -- extended attributes and the control plane -------------------------------

    def _target(self, inode: int, view: View, ino: InodeNo) -> ctl.Target:
        subject = self.subject(view) if ino == ROOT_INO else None
        return ctl.Target(view, ino, inode == ROOT, subject)

    @handler
    async def getxattr(self, inode: InodeT, name: XAttrNameT, ctx: RequestContext) -> bytes:
        if name.startswith(b"trusted.") and ctx.uid != 0:
            raise FUSEError(errno.ENODATA)
        view, ino = self.table.get(inode)
        if ctl.is_control(name):
            return await self.controls.get(name, self._target(inode, view, ino), ctx.uid)
        return view.getxattr(ino, name)

    @handler
    async def listxattr(self, inode: InodeT, ctx: RequestContext) -> Sequence[XAttrNameT]:
        view, ino = self.table.get(inode)
        return [
            XAttrNameT(n)
            for n in view.listxattr(ino)
            if not ctl.is_control(n) and (ctx.uid == 0 or not n.startswith(b"trusted."))
        ]

    @handler
    async def setxattr(self, inode: InodeT, name: XAttrNameT, value: bytes, ctx: RequestContext) -> None:
        view, ino = self.table.get(inode)
        if ctl.is_control(name):
            await self.controls.set(name, value, self._target(inode, view, ino), ctx.uid)
            return
        await self._mutate(view, lambda rw, _: rw.setxattr(ino, name, value))

    @handler
    async def removexattr(self, inode: InodeT, name: XAttrNameT, ctx: RequestContext) -> None:
        view, ino = self.table.get(inode)
        if ctl.is_control(name):
            raise FUSEError(errno.EINVAL)
        await self._mutate(view, lambda rw, _: rw.removexattr(ino, name))


def _names(rw: RwView) -> Names:
    """A volume's namespace. One without names is one file: no directory to change."""
    names = rw.names
    if names is None:
        raise FUSEError(errno.ENOTDIR)
    return names
