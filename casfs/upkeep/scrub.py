"""Scrub: re-read and re-hash every blob the store's images, volumes and snapshots
reach, say what holds each damaged or missing one, and heal it from another store.

The walk goes root by root (each image, each volume's base, each snapshot), down trees
and chunk maps, reading every blob from the store itself (no cache) through its check:
BLAKE3 of the plaintext against the id. A blob found damaged is recorded as any read
records it (STORE/damaged/, so the next import of that content stores it again), and
reported with what holds it: the image, volume or snapshot, the file's path inside it
and the byte range its chunk covers (a block volume's range has no path). A subtree or
file met again under another root (a clone's base, a snapshot sharing most of its
volume) is not read again: the damage found below it is reported under the new holder
too.

Healing (`heal`) asks a source (a store path or ssh://, as `casfs pull` takes, through
replica.peers.blob_fetcher, which the CLI hands in) for each damaged blob by its id,
verifies the bytes against the id, and stores them again (a batch heals a blob marked
damaged instead of deduplicating against it). A source that lacks a blob, or sends
wrong bytes, leaves it unhealed, and the report says so.

Progress is saved after each root (STORE/scrub/state.json): an interrupted scrub, run
again, resumes after the last root it finished. Safe beside mounts, imports and folds:
it holds the store's shared lock while it reads (gc waits), reads only what roots name,
and changes nothing but damaged marks and, when healing, the damaged blobs' files.
Overlays of mounted volumes (their upper files) are not blobs and are not scrubbed.
Passthrough's whole-file cache (STORE/cache/files) is re-hashed too, at the end of a scrub
of the whole store (Scrubber.file_cache): a file that no longer matches the BLAKE3
recorded at its fill is removed (the next open fills it again from verified chunks), and
reported, not counted as damage (it is a copy).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from casfs import images, volumes
from casfs.errors import CasfsError, Corruption, MissingBlob, NotFound
from casfs.kinds import BlobKind, VolumeKind
from casfs.lifecycle.faults import fault_point
from casfs.repo import Repository
from casfs.snapshots.chunkmap import PAGE_ENTRIES, MapRoot, decode_page, is_mapped
from casfs.snapshots.tree import Tree
from casfs.store.filecache import FileCache, cache_root
from casfs.store.ids import ZERO_ID, BlobId

STATE_VERSION = 1
_KIND_NAMES = {
    BlobKind.DATA: "data",
    BlobKind.TREE: "tree",
    BlobKind.MAP_ROOT: "map root",
    BlobKind.MAP_PAGE: "map page",
}
_KINDS = {name: kind for kind, name in _KIND_NAMES.items()}


@dataclass(frozen=True)
class Holder:
    """Where a damaged blob is used: `subject` ("image NAME", "volume NAME",
    "snapshot VOL@N"), the file's path in it ("" for a block volume or image; a damaged
    directory's own path), and the bytes [start, end) of that file (or disk) it holds
    (a map root: the whole file; a map page: its chunks' bytes; a directory: 0, 0)."""

    subject: str
    path: str
    start: int
    end: int


@dataclass
class Damage:
    blob: str  # hex id
    kind: str  # data, tree, map root, map page
    problem: Literal["missing", "corrupt"]
    message: str
    holders: list[Holder] = field(default_factory=list)
    healed_from: str | None = None
    unhealed: str | None = None  # why a heal did not happen


@dataclass
class ScrubReport:
    roots: int = 0  # roots walked (this run)
    resumed_after: int = 0  # roots a previous, interrupted run had finished
    blobs: int = 0  # blobs read and re-hashed
    bytes: int = 0  # their plaintext bytes
    damaged: list[Damage] = field(default_factory=list)
    cache_removed: list[str] = field(default_factory=list)  # cached files that failed their digest

    @property
    def clean(self) -> bool:
        return all(d.healed_from for d in self.damaged)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "clean": self.clean}


@dataclass(frozen=True)
class Root:
    subject: str
    blob: BlobId
    kind: VolumeKind
    size: int


def roots(repo: Repository, volume: str | None = None, image: str | None = None) -> list[Root]:
    """What to scrub: every image, volume base and snapshot (or those of one volume or
    image), images first (clones share their blobs, found then without reading again)."""
    found: list[Root] = []
    for info in images.list_images(repo):
        if info.root and (image is None or info.name == image) and volume is None:
            found.append(Root(f"image {info.name}", BlobId(bytes.fromhex(info.root)), info.kind, info.size))
    for vol in volumes.list_volumes(repo):
        if image is not None or (volume is not None and vol.name != volume):
            continue
        if vol.base:
            found.append(Root(f"volume {vol.name}", BlobId(bytes.fromhex(vol.base)), vol.kind, vol.size))
        for snap in volumes.list_snapshots(repo, vol.name):
            if snap.root:
                blob = BlobId(bytes.fromhex(snap.root))
                found.append(Root(f"snapshot {vol.name}@{snap.n}", blob, vol.kind, snap.size))
    if (volume or image) and not found:
        what = f"volume {volume!r}" if volume else f"image {image!r}"
        raise NotFound(f"no {what} with stored content to scrub")
    return found


# What was found below a subtree or a file's content, relative to it: (damage, path
# below, start, end), so that another holder of the same id is told without a re-read.
_Found = list[tuple[Damage, str, int, int]]


class Stopped(Exception):
    """A scrub was asked to stop (its progress is saved: the next one resumes)."""


class Scrubber:
    def __init__(
        self,
        repo: Repository,
        rate: int | None = None,
        progress: Callable[[ScrubReport, int], None] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.repo = repo
        self.stop = stop
        self.rate = rate  # plaintext bytes a second, or None: as fast as the disk goes
        self.progress = progress
        self.report = ScrubReport()
        self._damage: dict[BlobId, Damage] = {}
        self._below: dict[BlobId, _Found] = {}  # subtrees and contents already walked
        self._t0 = time.monotonic()

    # -- the walk ----------------------------------------------------------------------

    def scrub(self, todo: list[Root], state: Path | None = None) -> ScrubReport:
        finished = _load_state(state, self) if state is not None else set()
        done = set(finished)
        for i, root in enumerate(todo):
            key = f"{root.subject} {root.blob.hex()}"
            if key in finished:  # (by an interrupted run: its damage is in the state)
                self.report.resumed_after += 1
                continue
            if root.kind == VolumeKind.DIR:
                found = self._tree(root.blob)
            else:
                found = self._content(root.blob, root.size, None)
            for damage, path, start, end in found:
                _add_holder(damage, Holder(root.subject, path, start, end))
            self.report.roots += 1
            done.add(key)
            if state is not None:
                _save_state(state, done, self.report)
                fault_point("scrub:after-root")
            if self.progress is not None:
                self.progress(self.report, len(todo) - i - 1)
        if state is not None:
            state.unlink(missing_ok=True)  # finished: the next scrub starts afresh
        return self.report

    def file_cache(self) -> None:
        """Re-hash passthrough's cached files; remove (and report) those that fail."""
        for name, _why in FileCache(cache_root(self.repo.path)).check():
            self.report.cache_removed.append(name)

    def _tree(self, bid: BlobId) -> _Found:
        if bid in self._below:
            return self._below[bid]
        found: _Found = []
        plain = self._read(bid, BlobKind.TREE)
        if plain is None:
            found.append((self._damage[bid], "/", 0, 0))
        else:
            tree = Tree.decode(plain)
            for e in tree.entries:
                name = "/" + e.name.decode(errors="surrogateescape")
                if e.is_dir:
                    below = self._tree(e.blob)
                elif e.is_file and e.blob != ZERO_ID:
                    below = self._content(e.blob, e.attrs.size, tree.chunk_size)
                else:
                    continue
                found += [(d, name + (p if p != "/" else ""), s, t) for d, p, s, t in below]
        self._below[bid] = found
        return found

    def _content(self, bid: BlobId, size: int, chunk_size: int | None) -> _Found:
        """A file's content (chunk_size: its tree's) or a block root (None: a map)."""
        if bid in self._below:
            return self._below[bid]
        found: _Found = []
        if chunk_size is not None and not is_mapped(bid, size, chunk_size):
            if self._read(bid, BlobKind.DATA) is None:
                found.append((self._damage[bid], "", 0, size))
        else:
            found = self._map(bid, size)
        self._below[bid] = found
        return found

    def _map(self, bid: BlobId, size: int) -> _Found:
        plain = self._read(bid, BlobKind.MAP_ROOT)
        if plain is None:
            return [(self._damage[bid], "", 0, size)]
        root = MapRoot.decode(plain)
        cs, found = root.chunk_size, []
        if root.depth == 0:
            return self._chunks(root.ids, 0, cs, root.size)
        for p, page_id in enumerate(root.ids):
            if page_id == ZERO_ID:
                continue
            first = p * PAGE_ENTRIES
            page = self._read(page_id, BlobKind.MAP_PAGE)
            if page is None:
                end = min(root.size, (first + PAGE_ENTRIES) * cs)
                found.append((self._damage[page_id], "", first * cs, end))
            else:
                found += self._chunks(decode_page(page), first, cs, root.size)
        return found

    def _chunks(self, ids: list[BlobId], first: int, cs: int, size: int) -> _Found:
        found: _Found = []
        for n, cid in enumerate(ids, first):
            if cid != ZERO_ID and self._read(cid, BlobKind.DATA) is None:
                found.append((self._damage[cid], "", n * cs, min(size, (n + 1) * cs)))
        return found

    def _read(self, bid: BlobId, kind: BlobKind) -> bytes | None:
        """The blob's verified plaintext, or None: damaged (recorded in _damage)."""
        if bid in self._damage:
            return None
        if self.stop is not None and self.stop.is_set():
            raise Stopped("the scrub was asked to stop")
        try:
            plain = self.repo.blobs.get(bid)
        except MissingBlob as e:
            self._damaged(bid, kind, "missing", str(e))
            self.repo.blobs.mark_damaged(bid)  # (so that a heal or an import stores it)
            return None
        except Corruption as e:  # (the store has marked it damaged)
            self._damaged(bid, kind, "corrupt", str(e))
            return None
        self.report.blobs += 1
        self.report.bytes += len(plain)
        self._throttle()
        return plain

    def _damaged(self, bid: BlobId, kind: BlobKind, problem: Literal["missing", "corrupt"], why: str) -> None:
        damage = Damage(bid.hex(), _KIND_NAMES[kind], problem, why)
        self._damage[bid] = damage
        self.report.damaged.append(damage)

    def _throttle(self) -> None:
        if self.rate:
            ahead = self.report.bytes / self.rate - (time.monotonic() - self._t0)
            if ahead > 0.05:
                time.sleep(ahead)


def _add_holder(damage: Damage, holder: Holder) -> None:
    if holder not in damage.holders:
        damage.holders.append(holder)


# -- progress kept across an interrupt ---------------------------------------------------


def state_path(repo: Repository) -> Path:
    return repo.path / "scrub" / "state.json"


def _load_state(path: Path, scrubber: Scrubber) -> set[str]:
    """The roots an interrupted scrub finished, and what it had found (into `scrubber`)."""
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return set()
    except (OSError, ValueError):
        return set()  # (a torn state: start afresh, it is only progress)
    if state.get("version") != STATE_VERSION:
        return set()
    for d in state.get("damaged", []):
        holders = [Holder(**h) for h in d.pop("holders", [])]
        damage = Damage(**d, holders=holders)
        scrubber._damage[BlobId(bytes.fromhex(damage.blob))] = damage
        scrubber.report.damaged.append(damage)
    return set(state.get("done", []))


def _save_state(path: Path, done: set[str], report: ScrubReport) -> None:
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp")
    body = {"version": STATE_VERSION, "done": sorted(done), "damaged": [asdict(d) for d in report.damaged]}
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


# -- healing -------------------------------------------------------------------------------


# Fetches one blob by its id and kind from another store, verified against its id
# (CasfsError when that store lacks it or sends other bytes): replica.peers.blob_fetcher.
Fetch = Callable[[BlobId, BlobKind], bytes]


def heal(repo: Repository, report: ScrubReport, source: str, fetch: Fetch) -> None:
    """Fetch each damaged blob of `report` from `source` by its id, verify it, and store
    it again; the report says what was healed from where, and why not otherwise."""
    todo = [d for d in report.damaged if not d.healed_from]
    wants = [(BlobId(bytes.fromhex(d.blob)), _KINDS[d.kind]) for d in todo]
    for damage, why_not in zip(todo, heal_blobs(repo, wants, source, fetch).values(), strict=True):
        if why_not is None:
            damage.healed_from = source
        else:
            damage.unhealed = why_not


def heal_blobs(
    repo: Repository, wants: list[tuple[BlobId, BlobKind]], source: str, fetch: Fetch
) -> dict[BlobId, str | None]:
    """Fetch each blob from `source` by its id, verify it and store it again (a batch
    stores a blob marked damaged again instead of deduplicating against it): for each,
    None once it reads back through its check, or why not."""
    result: dict[BlobId, str | None] = {}
    if not wants:
        return result
    for bid, _ in wants:  # (before the batch, which reads the marks: a missing blob too)
        repo.blobs.mark_damaged(bid)
    with repo.batch() as batch:
        for bid, kind in wants:
            try:
                plain = fetch(bid, kind)
            except CasfsError as e:  # (the source lacks it, or sent other bytes)
                result[bid] = f"{source}: {e}"
                continue
            batch.put(plain, kind)
            result[bid] = None
        batch.commit()
    for bid, why_not in result.items():  # read back through the check: healed means readable
        if why_not is None:
            try:
                repo.blobs.get(bid)
            except (Corruption, MissingBlob) as e:
                result[bid] = f"stored again, still unreadable: {e}"
    return result


def describe(damage: Damage) -> Iterator[str]:
    """Lines for a person: the blob, then what holds it."""
    state = f"healed from {damage.healed_from}" if damage.healed_from else (damage.unhealed or "not healed")
    yield f"{damage.problem:8} {damage.kind:9} {damage.blob}  {damage.message} [{state}]"
    for h in damage.holders:
        where = f"{h.path} " if h.path else ""
        yield f"         held by {h.subject}: {where}bytes {h.start}-{h.end}"
