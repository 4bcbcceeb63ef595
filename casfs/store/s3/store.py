"""S3BlobStore: blobs in packs in a bucket (packfmt), the catalog and staging local.

    STORE/blobs.json        where the blobs are (location)
    STORE/tmp/              stagings in flight (staging)
    STORE/cache/index/      copies of index objects (immutable: fetched once per host)
    STORE/cache/blobs/      blobs fetched, verified (diskcache: bounded, LRU)
    STORE/damaged/<id>      blobs that failed their check when read

The store keeps an in-memory table of every published blob (table), loaded from the
index objects at first use and refreshed when something is not where it thought: an
absent blob on get/stored_size/delete, a pack gone (another process's gc), and before
every list(). has() answers from the table alone, without a request: a stale "no" makes
a writer upload a second copy (harmless, gc removes it), and a stale "yes" is checked
against the catalog by the writer anyway (refcount.ledger).

Deleting a blob records a dead object for its pack; the pack and its index go once no
blob in it is live. A partly dead pack keeps its dead blobs' bytes until gc repacks it.

Another store on the same bucket may rely on a pack (pins: a reference object), and this
store may rely on another's: an adopted object names blobs in the other store's pack,
read where they are (Pack.foreign); dropping its last blob drops the reference, never
the pack.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from casfs.errors import Corruption, MissingBlob
from casfs.store import BlobStore, Domain
from casfs.store.damaged import DamagedMarks
from casfs.store.ids import BlobId
from casfs.store.packfile import ENTRY, dead_stagings
from casfs.store.s3 import packfmt, pins
from casfs.store.s3.diskcache import DiskCache
from casfs.store.s3.location import Credentials, Location
from casfs.store.s3.remote import Remote, RemoteError
from casfs.store.s3.spans import SpanReader
from casfs.store.s3.staging import S3Staging
from casfs.store.s3.table import Foreign, Pack, PackTable
from casfs.store.s3.table import Location as Copy
from casfs.store.verified import verified

log = logging.getLogger(__name__)

UPLOAD_THREADS = 4


class S3BlobStore(DamagedMarks, BlobStore):
    def __init__(self, root: Path, loc: Location, creds: Credentials) -> None:
        self.root = root
        self.loc = loc
        self.creds = creds
        self.remote = Remote(loc, creds)
        self._remotes: dict[str, Remote] = {loc.prefix: self.remote}  # by prefix (remote_for)
        self.tmp_dir = root / "tmp"
        self.index_dir = root / "cache" / "index"
        self.damaged_dir = root / "damaged"
        self.cache = DiskCache(root / "cache" / "blobs", loc.cache_bytes)
        self.spans = SpanReader(self.cache)
        self.table = PackTable()
        self._loaded_at: float | None = None
        self._refresh_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def uploads(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="casfs-s3")
            return self._pool

    def remote_for(self, prefix: str) -> Remote:
        """A client for another prefix of this bucket (another store's: adoption)."""
        with self._pool_lock:
            remote = self._remotes.get(prefix)
            if remote is None:
                remote = self._remotes[prefix] = Remote(
                    dataclasses.replace(self.loc, prefix=prefix), self.creds
                )
            return remote

    def create(self) -> None:
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.index_dir.mkdir(parents=True, exist_ok=True)

    def staging(self) -> S3Staging:
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        return S3Staging(self)

    # -- the table -------------------------------------------------------------------

    def refresh(self, since: float | None = None) -> None:
        """Bring the table up to date with the bucket: index objects added and removed,
        dead records. With `since` (a time.monotonic()), only if no refresh has started
        after it: concurrent misses share one listing."""
        with self._refresh_lock:
            if since is not None and self._loaded_at is not None and self._loaded_at >= since:
                return
            started = time.monotonic()
            # Known before the listing: a pack published while it runs is not dropped.
            known = self.table.names()
            names = {key.rsplit("/", 1)[-1] for key, _ in self.remote.list("index/")}
            names |= {key.rsplit("/", 1)[-1] for key, _ in self.remote.list("adopted/")}
            dead: dict[str, set[BlobId]] = {}
            for key, _ in self.remote.list("dead/"):
                _, name, hexid = key.split("/")
                with contextlib.suppress(ValueError):
                    dead.setdefault(name, set()).add(BlobId(bytes.fromhex(hexid)))
            for name in known - names:
                self.table.drop(name)
            new = sorted(names - self.table.names())
            for name, loaded in zip(new, self.uploads().map(self._load_index, new), strict=True):
                if loaded is not None:
                    size, entries, foreign = loaded
                    self.table.add(name, size, entries, dead.get(name, ()), foreign)
            for name in names:
                for bid in dead.get(name, ()):
                    if name not in new:
                        self.table.mark_dead(name, bid)
            self._loaded_at = started

    def _ensure_loaded(self) -> None:
        if self._loaded_at is None:
            self.refresh()

    def _load_index(self, name: str) -> tuple[int, list[packfmt.Entry], Foreign | None] | None:
        """An index object (`name` a pack's), or an adopted one (`<pack>.<tag>`)."""
        adopted = "." in name
        key = packfmt.adopted_key(name) if adopted else packfmt.index_key(name)
        what = f"{key} in {self.remote.where}"

        def decode(data: bytes) -> tuple[int, list[packfmt.Entry], Foreign | None]:
            if not adopted:
                return (*packfmt.decode_index(data, what), None)
            head, size, entries = packfmt.decode_adopted(data, what)
            return size, entries, Foreign(head["owner"], head["store"], head["pack"])

        try:
            return decode((self.index_dir / name).read_bytes())
        except (FileNotFoundError, Corruption):
            pass
        try:
            data = self.remote.get(key)
        except FileNotFoundError:
            return None  # deleted since the listing
        try:
            loaded = decode(data)
        except Corruption as e:
            log.error("%s: its blobs are unreachable until it is rewritten", e)
            return None
        self._cache_index(name, data)
        return loaded

    def _cache_index(self, name: str, data: bytes) -> None:
        try:
            self.index_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.index_dir / f".{name}.{os.getpid()}.{threading.get_ident()}"
            tmp.write_bytes(data)
            os.replace(tmp, self.index_dir / name)
        except OSError as e:
            log.warning("cannot keep a copy of index %s: %s", name, e)

    def published(
        self, name: str, size: int, entries: list[packfmt.Entry], index: bytes, foreign: Foreign | None = None
    ) -> None:
        """A staging wrote pack `name` and its index (or adopted object `name`, naming
        `foreign`): its blobs are visible now."""
        self.table.add(name, size, entries, foreign=foreign)
        self._cache_index(name, index)

    def reload(self) -> None:
        """Forget every index and read them all again (after a pack was rewritten
        behind the store's back: tests that damage one)."""
        with self._refresh_lock:
            for name in self.table.names():
                self.table.drop(name)
                with contextlib.suppress(FileNotFoundError):
                    (self.index_dir / name).unlink()
            self._loaded_at = None
        self.cache.clear()
        self.refresh()

    # -- reads -----------------------------------------------------------------------

    def get(self, bid: BlobId, domain: Domain | None = None) -> bytes:
        cached = self._cached(bid, domain, None, nowait=False)
        if cached is not None:
            return cached
        corrupt: Corruption | None = None
        locations = self._locate(bid)
        for _ in range(2):
            asked = time.monotonic()
            gone = False
            for name, offset, length in locations:
                pack = self.table.pack(name)
                remote, key = self._source(name, pack)
                try:
                    stored = self.spans.read(remote, key, pack, bid, offset, length)
                except FileNotFoundError:
                    gone = True  # deleted by another process's gc since we loaded
                    continue
                except RemoteError as e:
                    log.error("blob %s: %s", bid.hex(), e)
                    raise RemoteError(f"blob {bid.hex()}: {e}", e.code) from None
                try:
                    plain = verified(bid, stored, domain)
                except Corruption as e:
                    self.cache.discard(bid)
                    corrupt = e
                    continue
                self.cache.put(bid, stored)
                return plain
            if not gone:
                break
            self.refresh(since=asked)
            locations = self.table.locate(bid)
        if corrupt is not None:
            self.mark_damaged(bid)
            raise corrupt
        raise MissingBlob(f"blob {bid.hex()} is missing")

    def _source(self, name: str, pack: Pack | None) -> tuple[Remote, str]:
        """Where pack `name`'s bytes are: this prefix's packs/, or an adopted pack's owner's."""
        if pack is not None and pack.foreign is not None:
            return self.remote_for(pack.foreign.prefix), packfmt.pack_key(pack.foreign.pack)
        return self.remote, packfmt.pack_key(name)

    def _locate(self, bid: BlobId) -> list[Copy]:
        """Every live copy of `bid`, newest first; the table refreshed once if it knows
        none (another process may have published it since we loaded)."""
        self._ensure_loaded()
        asked = time.monotonic()
        locations = self.table.locate(bid)
        if not locations:
            self.refresh(since=asked)
            locations = self.table.locate(bid)
        return locations

    def where(self, bid: BlobId) -> tuple[Foreign, int, int, int] | None:
        """Where the bytes of `bid` are, for a store adopting it: (the pack, as another
        store names it; the pack's size; offset; stored length), or None."""
        for name, offset, length in self._locate(bid):
            pack = self.table.pack(name)
            if pack is None:
                continue
            foreign = pack.foreign or Foreign(self.loc.prefix, self.loc.store_id, name)
            return foreign, pack.size, offset, length
        return None

    def read_foreign(self, foreign: Foreign, offset: int, length: int) -> bytes:
        """Stored bytes from another store's pack (not verified: the caller does)."""
        return self.remote_for(foreign.prefix).get(packfmt.pack_key(foreign.pack), offset, length)

    def get_if_cached(self, bid: BlobId, max_stored: int, domain: Domain | None = None) -> bytes | None:
        """From the local cache, if the blob is there and in the page cache."""
        return self._cached(bid, domain, max_stored, nowait=True)

    def _cached(self, bid: BlobId, domain: Domain | None, max_size: int | None, nowait: bool) -> bytes | None:
        stored = self.cache.get(bid, max_size, nowait)
        if stored is None:
            return None
        try:
            return verified(bid, stored, domain)
        except Corruption:
            self.cache.discard(bid)  # a damaged copy here says nothing of the bucket's
            return None

    def has(self, bid: BlobId) -> bool:
        self._ensure_loaded()
        return self.table.has(bid)

    def stored_size(self, bid: BlobId) -> int:
        locations = self._locate(bid)
        if not locations:
            raise MissingBlob(f"blob {bid.hex()} is missing")
        return locations[0][2]

    def list(self) -> Iterator[BlobId]:
        self.refresh()
        return iter(self.table.live_ids())

    # -- deletes ---------------------------------------------------------------------

    def delete(self, bid: BlobId) -> None:
        # (Another process's cache may keep a copy: verified bytes, read only by a
        # reader the catalog sent there, and evicted in time.)
        self.cache.discard(bid)
        for name, _, _ in self._locate(bid):
            pack = self.table.pack(name)
            if pack is None:
                continue
            with pack.lock:  # its dead records are written before the pack goes
                live = self.table.mark_dead(name, bid)
                # (a pack another store relies on stays, all dead: record the last one too)
                if live > 0 or (live == 0 and not self.remove_pack(name, tuple(pack.entries))):
                    self.remote.put_new(packfmt.dead_key(name, bid), b"")

    def remove_pack(self, name: str, ids: Iterable[BlobId]) -> bool:
        """Index first (the blobs vanish at once), then the pack, then its dead records.
        A pack another store relies on stays (pins: False). An adopted one: the
        reference in its owner's prefix goes first, then the adopted object; the
        owner's pack is the owner's."""
        pack = self.table.pack(name)
        foreign = pack.foreign if pack is not None else None
        if foreign is not None:
            pins.unpin(self, foreign, pins.tag_of(name))
            self.remote.delete([packfmt.adopted_key(name)])
        elif pins.may_remove(self, name):
            self.remote.delete([packfmt.index_key(name)])
        else:
            return False
        self.table.drop(name)
        with contextlib.suppress(FileNotFoundError):
            (self.index_dir / name).unlink()
        own = [] if foreign is not None else [packfmt.pack_key(name)]
        self.remote.delete([*own, *(packfmt.dead_key(name, b) for b in ids)])
        if foreign is None:
            pins.removed(self, name)
        return True

    def compact(self, below: float) -> tuple[int, int]:
        from casfs.store.s3.repack import repack

        return repack(self, below)

    def claim(self, store_id: str) -> None:
        """Make the prefix this store's (packfmt.CLAIM); Conflict if another has it."""
        import socket

        from casfs.errors import Conflict

        mine = {"store": store_id, "host": socket.gethostname(), "path": str(self.root)}
        if self.remote.put_new(packfmt.CLAIM, json.dumps(mine).encode()):
            return
        try:
            owner = json.loads(self.remote.get(packfmt.CLAIM))
        except (ValueError, FileNotFoundError):
            owner = {}
        if owner.get("store") != store_id:
            raise Conflict(
                f"{self.loc.url} belongs to the store at {owner.get('host', '?')}:{owner.get('path', '?')}: "
                "give each store its own prefix"
            )

    # -- leftovers and marks ---------------------------------------------------------

    def recover_staging(self, owner_alive: Callable[[int], bool]) -> int:
        """Remove the stagings of dead processes: their local files, and the packs they
        uploaded without an index (named in their .name files)."""
        removed = 0
        for entry in dead_stagings(self.tmp_dir, owner_alive):
            if not entry.is_dir():
                os.unlink(entry.path)
                continue
            for f in os.scandir(entry.path):
                if f.name.endswith(".name"):
                    name = Path(f.path).read_text().strip()
                    if not self.remote.exists(packfmt.index_key(name)):
                        self.remote.delete([packfmt.pack_key(name)])
                elif f.name.endswith(".ref"):  # a pin of a batch that died (staging.pin)
                    try:
                        doc = json.loads(Path(f.path).read_text())
                        foreign, tag = Foreign(doc["prefix"], doc["store"], doc["pack"]), str(doc["tag"])
                    except (ValueError, KeyError, TypeError):
                        continue  # (cut short by the crash: written before its pin, so no pin)
                    if not self.remote.exists(packfmt.adopted_key(f"{foreign.pack}.{tag}")):
                        pins.unpin(self, foreign, tag)
                elif f.name.endswith(".ent"):
                    removed += f.stat().st_size // ENTRY.size
            shutil.rmtree(entry.path)
        return removed


def connect(root: Path, loc: Location) -> S3BlobStore:
    """The store of `root` whose blobs are at `loc`, its table loaded: the first request
    is made here, so a wrong endpoint, wrong credentials or a missing bucket stop the
    command that opens the store with one line (NotFound for a missing bucket, exit 3;
    CasfsError otherwise, exit 1), not its first read."""
    from casfs.errors import CasfsError, NotFound
    from casfs.store.s3.location import resolve

    loc, creds = resolve(loc)
    where = f"{loc.url} at {loc.endpoint or 'AWS'}"
    if not creds.key_id or not creds.secret:
        raise CasfsError(
            f"no credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or a profile in ~/.aws/credentials)"
        )
    store = S3BlobStore(root, loc, creds)
    try:
        store.refresh()
    except RemoteError as e:
        if e.code == "NoSuchBucket":
            raise NotFound(f"bucket {loc.bucket} does not exist at {loc.endpoint or 'AWS'}") from None
        if e.code in ("AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId", "403", "401"):
            raise CasfsError(
                f"access to {where} refused ({e.code}): check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            ) from None
        if e.code == "unreachable":
            raise CasfsError(
                f"cannot reach the object store at {loc.endpoint or 'AWS'} (AWS_ENDPOINT_URL)"
            ) from None
        raise CasfsError(f"cannot open {where}: {e}") from None
    return store
