"""A batch of blobs on its way into an S3 store: local pack files, uploaded as they fill,
published by writing their index objects.

    STORE/tmp/<pid>-<random>/<n>.pack, <n>.ent   the pack being filled (store.packfile)
    STORE/tmp/<pid>-<random>/<n>.name   the pack's object name, written before its upload
    STORE/tmp/<pid>-<random>/<pack>.<tag>.ref   a pin (pins.pin) of another store's pack,
                                        written before the reference object

A pack is sealed and its upload starts (on the store's upload threads) once it holds
PACK_TARGET bytes, so a large import uploads while it hashes and compresses. publish()
seals the last pack, waits for every upload, then writes each pack's index object:
only then are its blobs visible, to this process and to every other. A pack uploaded
without its index (a crash, a failed publish) is invisible; discard() deletes it, and
recover_staging() deletes those a dead process left (it finds their names in .name).

A staging may also adopt blobs of another store's packs on the same bucket (pin, then
adopt: no bytes move); publish() writes one adopted object per such pack, beside the
index objects, and discard() removes the references of those it did not publish.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from casfs.errors import CasfsError
from casfs.store.ids import BlobId
from casfs.store.packfile import PackStaging, StagedPack, close_pack
from casfs.store.s3 import packfmt
from casfs.store.s3.table import Foreign

if TYPE_CHECKING:
    from casfs.store.s3.store import S3BlobStore

log = logging.getLogger(__name__)

PACK_TARGET = 8 << 20  # restic's default is 16 MiB; 4-16 MiB measured alike here


@dataclass
class _Pack(StagedPack):
    upload: Future[bool] | None = None
    index_tried: bool = False


@dataclass
class _Adoption:
    """The blobs this staging adopts from one pack of another store."""

    foreign: Foreign
    tag: str
    size: int  # the pack's
    entries: list[packfmt.Entry] = field(default_factory=list)
    pinned_at: float = field(default_factory=time.monotonic)  # (just before the pin)
    tried: bool = False
    published: bool = False

    @property
    def name(self) -> str:
        return f"{self.foreign.pack}.{self.tag}"


class S3Staging(PackStaging[_Pack]):
    def __init__(self, store: S3BlobStore) -> None:
        super().__init__(store.tmp_dir, PACK_TARGET, _Pack)
        self.store = store
        self._adopted: dict[Foreign, _Adoption] = {}
        self.published_names: list[str] = []  # the packs publish() made visible

    def pin(self, packs: dict[Foreign, int]) -> set[Foreign]:
        """Pin other stores' packs (pack -> its size) for adopt(), in parallel; returns
        those refused (being deleted by their owner, or gone): copy their blobs."""
        import json
        import uuid

        from casfs.store.s3 import pins

        with self._lock:
            todo = [
                _Adoption(f, uuid.uuid4().hex[:16], size)
                for f, size in packs.items()
                if f not in self._adopted
            ]
            # Known before pinning: a pin that fails half done is undone by discard().
            self._adopted.update((a.foreign, a) for a in todo)
        for a in todo:  # (recover_staging unpins these if this process dies)
            doc = {"prefix": a.foreign.prefix, "store": a.foreign.store, "pack": a.foreign.pack, "tag": a.tag}
            Path(f"{self.dir}/{a.name}.ref").write_text(json.dumps(doc))

        def pin(a: _Adoption) -> bool | BaseException:
            try:
                return pins.pin(self.store, a.foreign, a.tag)
            except BaseException as e:
                return e

        results = list(self.store.uploads().map(pin, todo))
        refused = set()
        with self._lock:
            for a, ok in zip(todo, results, strict=True):
                if ok is False:
                    refused.add(a.foreign)
                    del self._adopted[a.foreign]
                    os.unlink(f"{self.dir}/{a.name}.ref")
        failed = [e for e in results if isinstance(e, BaseException)]
        if failed:
            raise failed[0]
        return refused

    def adopt(self, bid: BlobId, foreign: Foreign, offset: int, length: int) -> int:
        """Stage `bid` as the blob at `offset` in another store's pack (pinned by pin()):
        published, it is this store's blob whose bytes are there. Returns its stored size."""
        with self._lock:
            if bid in self._sizes:
                return self._sizes[bid]
            self._adopted[foreign].entries.append((bid, offset, length))
            self._sizes[bid] = length
        return length

    def _seal(self, pack: _Pack) -> None:
        """Name the pack (the hash of its bytes), record the name, start its upload."""
        try:
            data = os.pread(pack.fd, pack.size, 0)
        finally:
            close_pack(pack)
        if len(data) != pack.size:
            raise OSError(f"staged pack {self._path(pack, 'pack')} is short")
        pack.name = packfmt.pack_name(data)
        with open(self._path(pack, "name"), "w") as f:
            f.write(pack.name)
        pack.upload = self.store.uploads().submit(
            self.store.remote.put_new, packfmt.pack_key(pack.name), data
        )

    def publish(self) -> None:
        if not self._seal_last():
            return
        with self._lock:
            packs = list(self._sealed)
        for pack in packs:
            assert pack.upload is not None
            pack.upload.result()  # raises the upload's error
        pool = self.store.uploads()
        indexes = [(p, packfmt.encode_index(p.size, p.entries)) for p in packs if not p.published]
        writes = [pool.submit(self.store.remote.put_new, packfmt.index_key(p.name), ix) for p, ix in indexes]
        failed = self._publish_adopted()
        for (pack, ix), write in zip(indexes, writes, strict=True):
            pack.index_tried = True
            try:
                write.result()
            except BaseException as e:
                failed = failed or e
                continue
            pack.published = True  # (discard must not delete it: its blobs are visible)
            self.store.published(pack.name, pack.size, pack.entries, ix)
        if failed is not None:
            raise failed
        with self._lock:
            self._done = True
            self._sealed.clear()
            self.published_names = [p.name for p in packs]
        shutil.rmtree(self.dir, ignore_errors=True)

    def _publish_adopted(self) -> BaseException | None:
        """Write the adopted objects (in parallel): their blobs are visible then."""
        from casfs.store.s3 import pins

        with self._lock:
            todo = [a for a in self._adopted.values() if a.entries and not a.published]
            unused = [a for a in self._adopted.values() if not a.entries]
        if any(time.monotonic() - a.pinned_at > pins.PIN_VALID_S for a in todo):
            # (its owner's gc may take the reference for stale: pinned again by a rerun)
            return CasfsError("pins of other stores' packs grew too old before the publish: run it again")
        for a in unused:  # (pinned, then nothing adopted from it)
            pins.unpin(self.store, a.foreign, a.tag)
            a.published = True
        objects = [
            (a, packfmt.encode_adopted(a.foreign.prefix, a.foreign.store, a.foreign.pack, a.size, a.entries))
            for a in todo
        ]
        writes = [
            self.store.uploads().submit(self.store.remote.put_new, packfmt.adopted_key(a.name), data)
            for a, data in objects
        ]
        failed: BaseException | None = None
        for (a, data), write in zip(objects, writes, strict=True):
            a.tried = True
            try:
                write.result()
            except BaseException as e:
                failed = failed or e
                continue
            a.published = True
            self.store.published(a.name, a.size, a.entries, data, a.foreign)
        return failed

    def discard(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            packs, self._sealed = list(self._sealed), []
            last, self._open = self._open, None
        if last is not None:
            close_pack(last)
        unpinned = self._unpin_unpublished()
        for pack in packs:
            try:
                assert pack.upload is not None
                if pack.published or pack.upload.result(timeout=60) is not True:
                    continue
                # An index write that failed on our side may have been done on the server's.
                if pack.index_tried and self.store.remote.exists(packfmt.index_key(pack.name)):
                    continue
                self.store.remote.delete([packfmt.pack_key(pack.name)])
            except BaseException as e:  # never raises: recover_staging finds it by its .name
                log.warning("cannot remove unpublished pack %s: %s", pack.name, e)
                return
        if unpinned:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _unpin_unpublished(self) -> bool:
        """Remove the references of adoptions not published; False if one could not be
        (recover_staging will: its .ref stays). Never raises."""
        from casfs.store.s3 import pins

        done = True
        for a in list(self._adopted.values()):
            try:
                # An adopted object whose write failed on our side may be there: it stays
                # pinned (its blobs are orphans here: gc sweeps them and unpins).
                if a.published or (a.tried and self.store.remote.exists(packfmt.adopted_key(a.name))):
                    continue
                pins.unpin(self.store, a.foreign, a.tag)
                os.unlink(f"{self.dir}/{a.name}.ref")
            except BaseException as e:
                log.warning("cannot unpin pack %s of %s: %s", a.foreign.pack, a.foreign.prefix, e)
                done = False
        return done
