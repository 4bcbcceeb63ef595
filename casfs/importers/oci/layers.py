"""Applying an image layer over the layers below it, as a runtime's unpacker does
(image-spec layer.md; the rules below are umoci's, whose unpack the tests compare with):

* Each entry replaces what is at its path, but a directory over a directory, which only
  takes the new attributes (xattrs included) and keeps its entries.
* `.wh.NAME` removes NAME from the layers below; `.wh..wh..opq` in a directory removes
  everything the layers below put in it. Neither removes what this layer itself wrote
  (its entries and their ancestors: the layer's "upper" paths), whichever comes first
  in the tar: a removed directory that this layer wrote into keeps what it wrote.
  Neither is an entry of the image.
* A hardlink may name a file of any layer below, or an earlier entry of this one.
* Every entry obeys the tar import's rules (casfs.importers.tarball): no absolute path
  or '..', nothing beneath a symlink or a non-directory, devices only when allowed; a
  whiteout may not name '.' or '..' or reach through a symlink. Symlinks that leave the
  root are refused once every layer is applied (tarball.check_symlinks).

A layer is bounded (LayerLimits): its entries, whiteouts included, and the memory its
application takes (the process's resident size grown since the layer began: the tree
of every entry is held until the image is built, ~1 KiB an entry, measured 130 MiB for
a 100,000-file layer, 329 MiB reported for 200,000). Past either it is refused
(HostileArchive, exit 2) before it can take the machine's memory.
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass

from casfs.errors import HostileArchive
from casfs.importers import Readable
from casfs.importers.tarball import add_member, member_path, read_tar
from casfs.importers.treebuilder import Dir, Node, Parts, PathConflict, TreeBuilder
from casfs.units import format_size

Progress = Callable[[int], None]

WHITEOUT = b".wh."
OPAQUE = b".wh..wh..opq"


# How often (in entries) a layer's memory is looked at: a read of /proc/self/statm.
_MEMORY_EVERY = 1024


@dataclass(frozen=True)
class LayerLimits:
    """What one layer may hold (settings import.layer_entries, import.layer_memory)."""

    entries: int
    memory: int  # bytes


class LayerApplier:
    """Applies layers in order into one TreeBuilder."""

    def __init__(self, b: TreeBuilder, chunk_size: int, allow_devices: bool, limits: LayerLimits) -> None:
        self.b = b
        self.chunk_size = chunk_size
        self.allow_devices = allow_devices
        self.limits = limits
        self.upper: set[Parts] = set()
        self.entries = 0
        self._resident_before = 0

    def apply(
        self,
        stream: Readable,
        plain_hook: Callable[[Readable], Readable] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.upper = set()
        self.entries = 0
        self._resident_before = resident_bytes()
        read_tar(stream, self._entry, progress, plain_hook)

    def _count(self) -> None:
        self.entries += 1
        limits = self.limits
        if self.entries > limits.entries:
            raise HostileArchive(
                f"the layer has more than {limits.entries} entries, the limit "
                "(`casfs config set import.layer_entries N` raises it)"
            )
        if self.entries % _MEMORY_EVERY == 0 and resident_bytes() - self._resident_before > limits.memory:
            raise HostileArchive(
                f"the layer takes more than {format_size(limits.memory)} of memory to apply, the limit, "
                f"after {self.entries} entries (`casfs config set import.layer_memory SIZE` raises it)"
            )

    def _entry(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        self._count()
        parts = member_path(m.name, m.name)
        if parts and parts[-1].startswith(WHITEOUT):
            self._whiteout(m, parts[:-1], parts[-1])
            return
        if not parts and not m.isdir():
            raise HostileArchive(f"layer entry {m.name!r} refused: the root must be a directory")
        old = self.b.lookup(parts)
        if old is not None and not (isinstance(old, Dir) and m.isdir()):
            self.b.remove(parts)
        try:
            add_member(self.b, tf, m, parts, self.chunk_size, self.allow_devices)
        except PathConflict as e:
            raise HostileArchive(f"layer entry {m.name!r} refused: {e}") from None
        self.upper.update(parts[:i] for i in range(len(parts) + 1))

    def _whiteout(self, m: tarfile.TarInfo, where: Parts, name: bytes) -> None:
        opaque = name == OPAQUE
        target = name[len(WHITEOUT) :]
        if not opaque and target in (b"", b".", b".."):
            raise HostileArchive(f"layer entry {m.name!r} refused: a whiteout of {target.decode()!r}")
        d = self._dir(m, where)
        if d is None:
            return  # nothing below to hide
        if opaque:
            self._purge(where, d, keep_self=True)
            return
        node = d.entries.get(target)
        if node is not None:
            self._purge((*where, target), node, keep_self=False)

    def _dir(self, m: tarfile.TarInfo, parts: Parts) -> Dir | None:
        """The directory a whiteout is in; None if there is none (nothing to remove).
        Reaching it through a symlink is refused: it could name a path outside."""
        cur: Dir | Node = self.b.root
        for name in parts:
            if not isinstance(cur, Dir):
                return None
            nxt = cur.entries.get(name)
            if nxt is None:
                return None
            if isinstance(nxt, Node) and stat.S_ISLNK(nxt.attrs.mode):
                raise HostileArchive(f"layer entry {m.name!r} refused: a whiteout beneath a symlink")
            cur = nxt
        return cur if isinstance(cur, Dir) else None

    def _purge(self, parts: Parts, node: Dir | Node, keep_self: bool) -> None:
        """Remove what is at `parts` unless this layer wrote it; else what is below it."""
        stack: list[tuple[Parts, Dir | Node, bool]] = [(parts, node, keep_self)]
        while stack:
            p, n, keep = stack.pop()
            if not keep and p not in self.upper:
                self.b.remove(p)
                continue
            if isinstance(n, Dir):
                stack.extend(((*p, name), child, False) for name, child in n.entries.items())


def resident_bytes() -> int:
    """This process's resident memory (Linux: /proc/self/statm's second field)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
