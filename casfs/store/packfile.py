"""Pack files, shared by the local pack store (store.packstore) and the S3 store: blobs
encoded (store.codec) and concatenated after a header, b"casfspk1" and 16 random bytes
(so no two packs are ever the same file or object). A pack says nothing of what it
holds: its index does (a table of the local store, an index object in a bucket).

A staging fills its packs in its own directory, STORE/tmp/<pid>-<random>/:

    <n>.pack    the pack being filled (header, encoded blobs, appended)
    <n>.ent     one 44-byte record per blob added (id, offset, length), written
                before its bytes (one write for a put_many's group): what
                recover_staging counts, as the pack itself cannot be parsed

and starts pack n + 1 once pack n holds `target` bytes; what it does with a full pack
(_seal: sync it, upload it) and how it publishes is the store's.
"""

from __future__ import annotations

import itertools
import logging
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from casfs.errors import Corruption
from casfs.store import Staging, codec
from casfs.store.ids import ID_SIZE, BlobId
from casfs.store.packwrite import DirectAppender, FileAppender, open_direct, write_all
from casfs.store.verified import verified

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from casfs.store import BlobStore

log = logging.getLogger(__name__)

PACK_MAGIC = b"casfspk1"
PACK_HEADER_SIZE = len(PACK_MAGIC) + 16
ENTRY = struct.Struct(f"<{ID_SIZE}sQI")

Entry = tuple[BlobId, int, int]  # id, offset in the pack, stored length


def pack_header() -> bytes:
    return PACK_MAGIC + os.urandom(16)


@dataclass
class StagedPack:
    """A pack a staging fills (fd: the pack, ent_fd: its .ent file; both closed once
    it is sealed, after out.finish())."""

    seq: int
    fd: int
    ent_fd: int
    size: int
    out: FileAppender  # how its bytes reach fd
    entries: list[Entry] = field(default_factory=list)
    name: str = ""  # its name once sealed (the store's)
    published: bool = False


P = TypeVar("P", bound=StagedPack)


class PackStaging(Staging, Generic[P]):
    """add() and add_stored() into pack files in the staging's directory; `_seal(pack)`
    is called (outside the lock, by the adding thread) with each pack that filled.
    `direct`: write the packs with O_DIRECT (store.packwrite; _seal calls out.finish())."""

    direct = False

    def __init__(self, tmp_dir: Path, target: int, pack_type: type[P]) -> None:
        import uuid

        self.tag = uuid.uuid4().hex[:16]
        self.dir = tmp_dir / f"{os.getpid()}-{self.tag}"
        self.dir.mkdir()
        self.target = target
        self._pack_type = pack_type
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._open: P | None = None
        self._sealed: list[P] = []
        self._sizes: dict[BlobId, int] = {}
        self._done = False  # published or discarded

    def _path(self, pack: StagedPack, ext: str) -> str:
        return f"{self.dir}/{pack.seq}.{ext}"

    def add(self, bid: BlobId, plain: bytes | memoryview) -> int:
        return self.add_many([(bid, plain)])[0]

    def add_many(self, blobs: Sequence[tuple[BlobId, bytes | memoryview]]) -> list[int]:
        with self._lock:
            known = {bid: self._sizes[bid] for bid, _ in blobs if bid in self._sizes}
        new = [(bid, codec.encode_parts(plain)) for bid, plain in blobs if bid not in known]
        if new:
            known.update(self._append(new))
        return [known[bid] for bid, _ in blobs]

    def add_stored(self, blobs: Sequence[tuple[BlobId, bytes]]) -> None:
        """add_many() of blobs already encoded (and verified by the caller: a repack)."""
        self._append([(bid, (stored,)) for bid, stored in blobs])

    def _append(self, blobs: Sequence[tuple[BlobId, Sequence[bytes | memoryview]]]) -> dict[BlobId, int]:
        """Append each blob (its encoded bytes: the parts joined) not staged yet, into
        the open pack, then the next; {id: stored size}. Each pack's records for them
        go first, in one write: a record without its blob (the append failed: a full
        disk) only makes recover_staging count one blob too many."""
        sizes: dict[BlobId, int] = {}
        full: list[P] = []
        try:
            with self._lock:
                todo: list[tuple[BlobId, Sequence[bytes | memoryview], int]] = []
                for bid, parts in blobs:
                    if bid in self._sizes or bid in sizes:
                        sizes[bid] = self._sizes.get(bid) or sizes[bid]
                        continue
                    sizes[bid] = length = sum(len(p) for p in parts)
                    todo.append((bid, parts, length))
                while todo:
                    pack = self._open or self._start()
                    end, n = pack.size, 0
                    while n < len(todo) and end < self.target:
                        end += todo[n][2]
                        n += 1
                    self._fill(pack, todo[:n])
                    del todo[:n]
                    if pack.size >= self.target:
                        full.append(pack)
                        self._open = None
        finally:
            for pack in full:  # (also after a failure: those are whole)
                self._seal_full(pack)
        return sizes

    def _fill(self, pack: P, blobs: list[tuple[BlobId, Sequence[bytes | memoryview], int]]) -> None:
        records, at = [], pack.size
        for bid, _, length in blobs:
            records.append(ENTRY.pack(bid, at, length))
            at += length
        write_all(pack.ent_fd, b"".join(records))
        for bid, parts, length in blobs:
            offset = pack.size
            try:
                pack.out.append(parts)
            except BaseException:
                pack.out.cut(offset)  # (a full disk) nothing of this blob stays
                raise
            pack.size += length
            pack.entries.append((bid, offset, length))
            self._sizes[bid] = length

    def _start(self) -> P:
        seq = next(self._seq)
        flags = os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        path = f"{self.dir}/{seq}.pack"
        if self.direct:
            fd, direct = open_direct(path, os.O_WRONLY | flags, 0o600)
        else:
            fd, direct = os.open(path, os.O_RDWR | flags, 0o600), False
        out = DirectAppender(fd, self.target) if direct else FileAppender(fd)
        try:
            header = pack_header()
            out.append((header,))
            ent_fd = os.open(f"{self.dir}/{seq}.ent", os.O_WRONLY | os.O_APPEND | flags, 0o600)
        except BaseException:
            out.close()
            os.close(fd)
            raise
        self._open = self._pack_type(seq, fd, ent_fd, len(header), out)
        return self._open

    def _seal(self, pack: P) -> None:
        """The store's: a full pack's fds are closed after it (sync it, upload it...)."""
        raise NotImplementedError

    def _seal_full(self, pack: P) -> None:
        self._seal(pack)
        with self._lock:
            self._sealed.append(pack)

    def _seal_last(self) -> bool:
        """publish()'s first step: seal the pack being filled (close it, if its only add
        failed); False if this staging was published or discarded already."""
        with self._lock:
            if self._done:
                return False
            if not self.dir.exists():
                raise FileNotFoundError(f"staging {self.dir} was removed by recover_staging")
            last, self._open = self._open, None
        if last is not None and last.entries:
            self._seal_full(last)
        elif last is not None:
            close_pack(last)
        return True


def close_pack(pack: StagedPack) -> None:
    pack.out.close()
    for fd in (pack.fd, pack.ent_fd):
        if fd >= 0:
            os.close(fd)
    pack.fd = pack.ent_fd = -1


def dead_stagings(tmp_dir: Path, owner_alive: Callable[[int], bool]) -> list[os.DirEntry[str]]:
    """The entries of tmp/ (stagings, tmp/<pid>-<tag>) whose writer, the pid their name
    starts with, is not `owner_alive`, and any not named by a pid."""
    try:
        entries = list(os.scandir(tmp_dir))
    except FileNotFoundError:
        return []
    return [e for e in entries if not ((pid := e.name.split("-", 1)[0]).isdigit() and owner_alive(int(pid)))]


def restage(
    store: BlobStore, staging: PackStaging[P], what: str, data: bytes | memoryview, live: Sequence[Entry]
) -> bool:
    """A repack's step: stage the live blobs of one pack (`data`, its bytes), each
    verified first; False, having staged none, if one fails (it is marked damaged and
    the pack left as it is: fsck reports the blob)."""
    view = memoryview(data)
    blobs = [(bid, bytes(view[offset : offset + length])) for bid, offset, length in live]  # (one copy)
    for bid, stored in blobs:
        try:
            verified(bid, stored, None)
        except Corruption as e:
            log.error("pack %s not repacked: %s", what, e)
            store.mark_damaged(bid)
            return False
    staging.add_stored(blobs)
    return True
