"""Where blob bytes live: the `BlobStore` interface every backend implements.

Modules: ids (BlobId, hashing), codec (on-disk encoding), verified (the check on every
read), packstore (PackBlobStore: a local store's blobs in pack files; with packindex,
its SQLite index, fdcache and packcompact), packfile (pack files and their staging,
shared with s3; packwrite appends to them, with O_DIRECT for local ones), local
(FileBlobStore: a file per blob, the layout of stores made before packs), memory
(MemoryBlobStore, for tests), faulty (a wrapper that fails on purpose), cache (an
LRU), verify (outside digests), damaged (the damaged-blob marks the local and S3
stores share), s3 (blobs in a bucket).

Lifecycle of a blob in a store (containerd's content store is the model):

  stage    Staging.add encodes the bytes and writes them under a private name;
           invisible to get/has/list/stored_size.
  publish  Staging.publish makes every staged blob durable, then visible under its
           id. A crash before publish leaves only staging leftovers (removed by
           recover_staging); a crash during it leaves each blob either absent or
           whole and durable, never half written.
  get      reads, decodes and re-hashes; wrong bytes are never returned.
  delete   idempotent; not durable by itself (see delete).

A store knows nothing of references: the catalog decides what is live, and every
caller above reaches blobs only through these methods (the repository is given one).
Failures are OSError (a disk's: ENOSPC, EIO...), MissingBlob or Corruption
(casfs.errors); no method returns partial or unverified bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Literal, Protocol

from casfs.store.ids import BlobId, blob_id

# Which hash names a blob (store.ids): data chunks are plain BLAKE3, metadata (trees,
# chunk maps) BLAKE3 in key-derivation mode. A read that says which is one hash.
Domain = Literal["data", "meta"]


class Staging(Protocol):
    """A batch of blobs on their way into a store: add them, then publish or discard.

    Thread-safe enough for one batch: add() may be called from several threads with
    different ids; publish() and discard() once, by the owner, after every add()."""

    def add(self, bid: BlobId, plain: bytes | memoryview) -> int:
        """Stage one blob (its id computed by the caller, in the right domain); returns
        its stored (encoded) size. Adding an id already staged here stages nothing and
        returns the same size. On error (OSError: ENOSPC, EIO) nothing of this blob is
        staged; what was staged before stays staged, unless the error is that of an
        earlier blob's deferred write (store.packwrite): then publish() fails too."""
        ...

    def add_many(self, blobs: Sequence[tuple[BlobId, bytes | memoryview]]) -> list[int]:
        """add() of each (id, plaintext), in order; their stored sizes. On error the
        blob it failed on and those after it are not staged. This default calls add();
        a pack staging takes its lock and writes its records once for them all."""
        return [self.add(bid, plain) for bid, plain in blobs]

    def publish(self) -> None:
        """Make every staged blob durable, then visible under its id (a blob already
        stored is replaced by the new copy: that heals a damaged one). Calling it
        again once it succeeded does nothing. If it raises, some blobs may have been
        published (whole and durable) and others not: the caller discards the
        staging and treats published blobs no catalog row names as orphans."""
        ...

    def discard(self) -> None:
        """Forget what is staged and not published. Never raises: it runs on error
        paths, where the first error is the one that matters; what it cannot remove
        is logged and left to recover_staging. Idempotent, also after publish."""
        ...


class BlobStore(Protocol):
    """The blobs of one store. Methods may be called from any thread.

    Implementations subclass this to inherit put(), get_many() and get_if_cached()."""

    def create(self) -> None:
        """Prepare a new, empty store (directories, buckets). Idempotent."""
        ...

    def staging(self) -> Staging:
        """A new, empty staging for a batch of writes. May raise OSError (a full
        disk); nothing is then left behind."""
        ...

    def get(self, bid: BlobId, domain: Domain | None = None) -> bytes:
        """The blob's plaintext, decoded and re-hashed in `domain` (None: either; a
        caller that cannot tell, such as an exporter walking trees and chunks through
        one getter, pays a second hash for metadata). Raises MissingBlob when no blob
        is published under `bid`, and Corruption (naming the blob) when the stored
        bytes do not decode or do not hash to `bid`: the blob is then also recorded
        damaged (mark_damaged). Never returns wrong bytes."""
        ...

    def get_many(
        self, bids: Sequence[BlobId], domain: Domain | None = None
    ) -> Iterator[tuple[BlobId, bytes | Exception]]:
        """get() of each id (once each), every blob's outcome yielded as soon as it is
        known, in no set order: its plaintext, or the exception get() would raise for it
        alone (MissingBlob, Corruption, OSError): one bad blob fails only its own
        readers. For read-ahead, which asks for runs of chunks stored side by side (a
        pack store reads them with one index query and one pread). This default calls
        get() for each."""
        for bid in dict.fromkeys(bids):
            try:
                plain = self.get(bid, domain)
            except Exception as e:
                yield bid, e
            else:
                yield bid, plain

    def get_if_cached(self, bid: BlobId, max_stored: int, domain: Domain | None = None) -> bytes | None:
        """get(), when it needs no wait for a disk or a network and the stored blob
        is at most `max_stored` bytes; None otherwise (having read nothing). For
        callers on an event loop. When it reads, it raises as get() does (an absent
        blob: MissingBlob or None). This default never reads: always None."""
        return None

    def has(self, bid: BlobId) -> bool:
        """Whether a blob is published under `bid` (not whether it is sound)."""
        ...

    def stored_size(self, bid: BlobId) -> int:
        """The published blob's stored (encoded) size in bytes; MissingBlob if none."""
        ...

    def delete(self, bid: BlobId) -> None:
        """Remove a published blob; idempotent (an absent blob is not an error).
        Not durable by itself: after a crash a deleted blob may be back, whole.
        Callers delete only blobs no catalog row names, so one that comes back is an
        orphan, and gc removes orphans."""
        ...

    def delete_many(self, bids: Sequence[BlobId]) -> None:
        """delete() of each id, as one batch where the store can (a pack store drops
        their index rows in one transaction). This default calls delete() for each."""
        for bid in bids:
            self.delete(bid)

    def list(self) -> Iterator[BlobId]:
        """Every published blob's id, once each, in no particular order; staged blobs
        are not listed. A blob published or deleted while the listing runs may or
        may not appear."""
        ...

    def recover_staging(self, owner_alive: Callable[[int], bool]) -> int:
        """Remove what stagings of dead writers left behind (a process that crashed
        between add and publish or discard): every staging whose owner pid is not
        `owner_alive`. Returns how many staged blobs were removed. Never touches
        published blobs or a live owner's staging; idempotent."""
        ...

    def mark_damaged(self, bid: BlobId) -> None:
        """Record that the blob failed a check, so a writer storing the same content
        stores it again instead of deduplicating against it. Best effort (a read-only
        store still reports the error, it only cannot remember it); never raises."""
        ...

    def damaged(self) -> set[BlobId]:
        """The blobs recorded damaged and not cleared since (kept across restarts
        where the store itself is)."""
        ...

    def clear_damaged(self, bid: BlobId) -> None:
        """Forget a damaged mark: a verified copy replaced the blob. Idempotent."""
        ...

    def compact(self, below: float) -> tuple[int, int]:
        """Reclaim the space deleted blobs still take (a pack store rewrites each pack
        whose live bytes are under `below` of its size, and drops what nothing in it is
        live); (packs rewritten or dropped, bytes reclaimed). Called with the store
        locked exclusively, as gc is. This default has nothing to do: (0, 0)."""
        return 0, 0

    def warm(self) -> None:
        """Start bringing in what reads will look at first (a pack store: its index),
        without waiting for it; for a process about to serve reads (a mount). Never
        raises. This default has nothing to bring in."""
        return None

    def close(self) -> None:
        """Let go of open files and connections (the repository's close() calls it);
        the store stays usable: they are opened again when needed. This default has
        nothing to let go of."""
        return None

    def put(self, plain: bytes) -> BlobId:
        """Store one data blob and publish it at once; returns its id. Idempotent.
        A convenience for tests and small writers: it takes no store lock and no
        catalog row names the blob, so gc may remove it (use a ledger Batch)."""
        bid = blob_id(plain)
        st = self.staging()
        try:
            st.add(bid, plain)
            st.publish()
        finally:
            st.discard()
        return bid
