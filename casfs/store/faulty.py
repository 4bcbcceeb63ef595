"""A blob store that fails on purpose: for tests of what happens above a failing disk.

    store = FaultyBlobStore(PackBlobStore(path), Faults.parse("stage:3:ENOSPC,publish:1:EIO"))

wraps any BlobStore; the nth call of an operation (counted from 1, per operation, since
the plan was made) raises the errno given, and every other call goes through. Plans
may also be armed while running (`faults.arm("publish", errno.EIO)`: the next call
fails), which is how a property test injects failures at random points. Operations:

    stage        Staging.add: nothing is staged (as a failed write or fsync of the file)
    publish      Staging.publish, before anything is published (as a failed syncfs)
    publish-half Staging.publish after half the blobs were published, as a crash or
                 an I/O error in the middle would leave them: published blobs no
                 catalog row names (orphans for gc), the rest still staged
    get          BlobStore.get (and get_if_cached, which always defers to it): an
                 errno, or with the errno name "corrupt" a Corruption, the blob marked
                 damaged (as the inner store would on bytes that fail their check)

A failure never leaves a half-written blob visible: the wrapper fails before or after
the inner store's own steps, as a real disk error would surface there.
"""

from __future__ import annotations

import errno as errnos
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from casfs.errors import Corruption
from casfs.store import BlobStore, Domain, Staging
from casfs.store.ids import BlobId

OPERATIONS = ("stage", "publish", "publish-half", "get")
CORRUPT = -1  # "errno" of an injected corruption on get


@dataclass
class Faults:
    """When to fail: (operation, nth call) -> errno; plus one-shot faults armed live."""

    planned: dict[tuple[str, int], int] = field(default_factory=dict)
    armed: dict[str, int] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    fired: int = 0

    @staticmethod
    def parse(plan: str) -> Faults:
        """ "op:n:ERRNO,…", e.g. "stage:3:ENOSPC,get:1:corrupt"."""
        faults = Faults()
        for part in filter(None, (p.strip() for p in plan.split(","))):
            op, n, name = part.split(":")
            faults.planned[(_check(op), int(n))] = _errno(name)
        return faults

    def arm(self, op: str, code: int) -> None:
        """The next call of `op` fails with `code`."""
        self.armed[_check(op)] = code

    def check(self, op: str) -> int | None:
        self.calls[op] += 1
        code = self.armed.pop(op, None)
        if code is None:
            code = self.planned.get((op, self.calls[op]))
        if code is not None:
            self.fired += 1
        return code


class FaultyBlobStore(BlobStore):
    def __init__(self, inner: BlobStore, faults: Faults) -> None:
        self.inner = inner
        self.faults = faults

    def create(self) -> None:
        self.inner.create()

    def staging(self) -> Staging:
        return _FaultyStaging(self.inner, self.faults)

    def get(self, bid: BlobId, domain: Domain | None = None) -> bytes:
        code = self.faults.check("get")
        if code == CORRUPT:
            self.inner.mark_damaged(bid)
            raise Corruption(f"blob {bid.hex()} is corrupt (injected)")
        _raise(code)
        return self.inner.get(bid, domain)

    def get_if_cached(self, bid: BlobId, max_stored: int, domain: Domain | None = None) -> bytes | None:
        return None  # every read goes through get(), where the faults are

    def has(self, bid: BlobId) -> bool:
        return self.inner.has(bid)

    def stored_size(self, bid: BlobId) -> int:
        return self.inner.stored_size(bid)

    def delete(self, bid: BlobId) -> None:
        self.inner.delete(bid)

    def delete_many(self, bids: Sequence[BlobId]) -> None:
        self.inner.delete_many(bids)

    def list(self) -> Iterator[BlobId]:
        return self.inner.list()

    def recover_staging(self, owner_alive: Callable[[int], bool]) -> int:
        return self.inner.recover_staging(owner_alive)

    def close(self) -> None:
        self.inner.close()

    def mark_damaged(self, bid: BlobId) -> None:
        self.inner.mark_damaged(bid)

    def damaged(self) -> set[BlobId]:
        return self.inner.damaged()

    def clear_damaged(self, bid: BlobId) -> None:
        self.inner.clear_damaged(bid)


class _FaultyStaging(Staging):
    def __init__(self, store: BlobStore, faults: Faults) -> None:
        self.store = store
        self.inner = store.staging()
        self.faults = faults
        # What was staged, for publish-half (which publishes part of it on its own).
        self.added: dict[BlobId, bytes] = {}

    def add(self, bid: BlobId, plain: bytes | memoryview) -> int:
        _raise(self.faults.check("stage"))
        size = self.inner.add(bid, plain)
        self.added.setdefault(bid, bytes(plain))
        return size

    def publish(self) -> None:
        _raise(self.faults.check("publish"))
        code = self.faults.check("publish-half")
        if code is not None:
            self._publish_half()
            _raise(code)
        self.inner.publish()

    def _publish_half(self) -> None:
        """Publish half of the staged blobs through a staging of their own, as a
        publish stopped half-way leaves them: those whole and visible, the rest not
        (still staged in the inner staging, which also holds the first half: the
        caller's discard drops it all, and a retried publish re-publishes them alike)."""
        half = list(self.added.items())[: len(self.added) // 2]
        part = self.store.staging()
        try:
            for bid, plain in half:
                part.add(bid, plain)
            part.publish()
        finally:
            part.discard()

    def discard(self) -> None:
        self.inner.discard()


def _check(op: str) -> str:
    if op not in OPERATIONS:
        raise ValueError(f"unknown operation {op!r}: one of {', '.join(OPERATIONS)}")
    return op


def _errno(name: str) -> int:
    if name == "corrupt":
        return CORRUPT
    code = getattr(errnos, name, None)
    if not isinstance(code, int):
        raise ValueError(f"unknown errno {name!r}")
    return code


def _raise(code: int | None) -> None:
    if code is not None:
        raise OSError(code, f"{os.strerror(code)} (injected)")
