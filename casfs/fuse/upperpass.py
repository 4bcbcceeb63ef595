"""FUSE passthrough for a writable directory volume's changed files: an open of a file
whose content is its upper file (casfs.vfs.overlay.files) is answered with that file,
and the kernel reads and writes it itself. What the daemon still learns of such a file,
and when, is casfs.vfs.rw.kernelfiles's.

One mode per inode while it is open (the kernel fails a passthrough open beside a
daemon-served one with EIO, and takes one backing file per inode):
  - an inode with a daemon-served handle: served by the daemon;
  - an inode open by passthrough: its backing id again;
  - else a writer copies the file up (if it has no upper file yet) and gets its upper
    file; a reader gets it where the file has one, else the daemon serves the base's
    chunks. A reader of a volume this mount has not claimed is served too (giving the
    kernel its upper file would claim it).
Upper files are registered read/write, whoever opens first: a later writer shares the
inode's one backing file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import trio

from casfs.errors import CasfsError
from casfs.fuse.passthrough import PassthroughOpens
from casfs.ids import InodeNo
from casfs.vfs.api import Fetched, RwView, View
from casfs.vfs.rw.dirkind import DirKind

log = logging.getLogger("casfs.daemon")

R = TypeVar("R")
Mutate = Callable[[View, Callable[[RwView, Fetched], R]], Coroutine[Any, Any, R]]


def kind_of(view: View) -> DirKind | None:
    """The directory volume behind a writable view (None: another kind of view)."""
    kind = getattr(view.rw, "kind", None)
    return kind if isinstance(kind, DirKind) else None


async def backing_id(
    opens: PassthroughOpens,
    view: View,
    ino: InodeNo,
    writer: bool,
    served_open: Callable[[], bool],
    mutate: Mutate[str | None],
) -> int:
    """The backing id to open (view, ino) with, or 0: served by the daemon."""
    backings, kind, rw = opens.backings(), kind_of(view), view.rw
    if backings is None or kind is None or rw is None or served_open():
        return 0
    if not (writer or rw.claimed):
        return 0
    key = (id(view), ino)
    try:
        path = await mutate(view, lambda _rw, _fetched: kind.kernel_open(ino, writer))
        if path is None:
            return 0
        try:
            return backings.acquire(key, path, writable=True)
        except OSError:
            kind.kernel.remove(ino, writer)  # (nothing the kernel wrote yet)
            raise
    except (CasfsError, OSError) as e:
        log.warning("passthrough: %s served by the daemon: %s", view.describe(ino), e)
        return 0


async def release(
    opens: PassthroughOpens, view: View, ino: InodeNo, writer: bool, mutate: Mutate[None]
) -> None:
    """A passthrough handle of a directory volume's file closed."""
    backings, kind = opens.backings(), kind_of(view)
    assert backings is not None and kind is not None, "only a backed handle is released here"
    backings.release((id(view), ino))
    if writer:
        await mutate(view, lambda _rw, _fetched: kind.kernel_release(ino, True))
    else:
        kind.kernel_release(ino, False)


async def fsync(view: View, ino: InodeNo) -> None:
    """The upper file the kernel holds for (view, ino), written by any of its handles:
    durable (the flush that follows commits its size; that flush syncs the file itself
    only if its size or mtime moved)."""
    kind = kind_of(view)
    path = None if kind is None else kind.kernel_file(ino)
    if path is not None:
        await trio.to_thread.run_sync(_fdatasync, path)


def _fdatasync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
