"""Prometheus metrics of a casfs mount daemon: every name in one place.

Counting is plain Python arithmetic on the daemon's trio thread (and, for blob
fetches, its read threads: integer and float updates under the GIL): no lock and no
prometheus_client object on the request path. The figures become samples only when a
scraper asks (CasfsCollector, on prometheus_client's HTTP thread), so a daemon without
`--metrics` pays one `is None` test per request, and one with it a clock read and a
bucket search.

Names follow Prometheus' conventions: a `casfs_` prefix, base units in the name
(`_seconds`, `_bytes`), `_total` for counters, and labels `mount` and, where it
applies, `op` or `volume`.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from casfs.repo import Repository
    from casfs.store import BlobStore
    from casfs.store.ids import BlobId

# FUSE request latency buckets: from a page-cache-fast read (10 us) to a stalled fold.
LATENCY_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0)
FOLD_BUCKETS = (1e-3, 1e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


class Histogram:
    """Counts per bucket (the last: above every bound), their sum, and how many.
    (Slots, no dataclass: observe() runs once per FUSE request.)"""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count), +Inf last: Prometheus' form."""
        out, running = [], 0
        for bound, n in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            running += n
            out.append((bound, float(running)))
        return out


@dataclass
class Counts:
    """What a mount daemon counts."""

    requests: dict[str, Histogram] = field(default_factory=dict)  # FUSE op -> latency
    read_bytes: int = 0
    written_bytes: int = 0
    cache_hits: int = 0  # chunks a read found in the chunk cache
    cache_misses: int = 0  # chunks it had to fetch
    fetches: int = 0  # blobs fetched from the store (packs or the object store)
    fetch_bytes: int = 0
    fetch_errors: int = 0
    fetch_seconds: Histogram = field(default_factory=Histogram)
    folds: int = 0  # snapshots' folds into blobs (a directory volume's, a block volume's)
    fold_bytes: int = 0  # what they stored as new blobs
    fold_seconds: Histogram = field(default_factory=lambda: Histogram(FOLD_BUCKETS))
    # Opens answered with a backing file, by what backs them ("cache": the whole-file
    # cache; "upper": a writable volume's upper file). Their reads and writes are the
    # kernel's: no request, no byte of theirs reaches the daemon or read_bytes.
    passthrough_opens: dict[str, int] = field(default_factory=dict)

    def passed_through(self, backing: str) -> None:
        self.passthrough_opens[backing] = self.passthrough_opens.get(backing, 0) + 1

    def fold(self, stored: int, seconds: float) -> None:
        self.folds += 1
        self.fold_bytes += stored
        self.fold_seconds.observe(seconds)

    def request(self, op: str, seconds: float) -> None:
        h = self.requests.get(op)
        if h is None:
            h = self.requests[op] = Histogram()
        h.counts[bisect.bisect_left(h.bounds, seconds)] += 1  # (observe(), inline: per request)
        h.sum += seconds
        h.count += 1


# The counts of this process's mount, when it serves metrics (casfs.fuse.daemon sets it).
counts: Counts | None = None


Got = TypeVar("Got", bytes, bytes | None)


def counted_get(get: Callable[[BlobId], Got]) -> Callable[[BlobId], Got]:
    """`get` (a blob fetch; or a fetch from the page cache only, None otherwise) counted
    into `counts` when metrics are on."""

    def fetch(bid: BlobId) -> Got:
        c = counts
        if c is None:
            return get(bid)
        t = time.perf_counter()
        try:
            data = get(bid)
        except Exception:
            c.fetch_errors += 1
            raise
        if data is not None:
            c.fetches += 1
            c.fetch_bytes += len(data)
            c.fetch_seconds.observe(time.perf_counter() - t)
        return data

    return fetch


def counted_get_many(
    get_many: Callable[[Sequence[BlobId]], Iterator[tuple[BlobId, bytes | Exception]]],
) -> Callable[[Sequence[BlobId]], Iterator[tuple[BlobId, bytes | Exception]]]:
    """`get_many` counted as get() is (the run's time spread over its blobs)."""

    def fetch_many(bids: Sequence[BlobId]) -> Iterator[tuple[BlobId, bytes | Exception]]:
        t = time.perf_counter()
        n = 0
        for bid, got in get_many(bids):
            c = counts
            if c is not None:
                if isinstance(got, Exception):
                    c.fetch_errors += 1
                else:
                    c.fetches += 1
                    c.fetch_bytes += len(got)
                n += 1
            yield bid, got
        c = counts
        if c is not None and n:
            each = (time.perf_counter() - t) / n
            for _ in range(n):
                c.fetch_seconds.observe(each)

    return fetch_many


@dataclass(frozen=True)
class Gauges:
    """Figures read when scraped: callables, so that nothing is kept up to date."""

    corrupt_reads: Callable[[], int]
    store: Callable[[], StoreReading]  # one catalog read a scrape


@dataclass(frozen=True)
class FileCacheReading:
    """The whole-file cache of a passthrough mount (casfs.fuse.passthrough), when scraped."""

    files: int
    disk_bytes: int  # what its files take on disk (holes take none)
    limit_bytes: int
    fills: dict[str, int]  # files filled, by when ("open": while it waited; "background")
    fill_bytes: dict[str, int]
    fill_failures: int  # background fills that failed (a damaged chunk, a full disk)
    too_large: int  # files larger than the bound, never filled
    queued: int  # background fills waiting
    served_from_fills_bytes: int  # read by the daemon's readers from fills in flight


@dataclass
class StoreReading:
    queue: dict[str, int]  # job state -> jobs of the store's queue
    volumes: Iterable[tuple[str, dict[str, int]]]  # (volume, figure -> bytes)


class CasfsCollector:
    """The samples of one mount (prometheus_client calls collect() at each scrape)."""

    def __init__(self, mount: str, c: Counts, gauges: Gauges) -> None:
        self.mount, self.c, self.gauges = mount, c, gauges
        # Set once the mount has passthrough (its cache exists from the kernel's INIT on).
        self.file_cache: Callable[[], FileCacheReading | None] = lambda: None

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        m, c = [self.mount], self.c
        ops = HistogramMetricFamily(
            "casfs_fuse_request_seconds", "FUSE requests served, by operation", labels=["mount", "op"]
        )
        for op, h in sorted(c.requests.items()):
            ops.add_metric([self.mount, op], h.cumulative(), h.sum)
        yield ops

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["mount"])
            family.add_metric(m, value)
            return family

        yield counter("casfs_read_bytes", "bytes read through the mount", c.read_bytes)
        yield counter("casfs_written_bytes", "bytes written through the mount", c.written_bytes)
        yield counter("casfs_chunk_cache_hits", "chunks reads found in the chunk cache", c.cache_hits)
        yield counter("casfs_chunk_cache_misses", "chunks reads had to fetch", c.cache_misses)
        yield counter("casfs_blob_fetches", "blobs fetched from the store", c.fetches)
        yield counter("casfs_blob_fetch_bytes", "plaintext bytes of the blobs fetched", c.fetch_bytes)
        yield counter(
            "casfs_blob_fetch_errors", "blob fetches that failed (missing, corrupt)", c.fetch_errors
        )
        yield counter("casfs_corrupt_reads", "reads that met a corrupt blob", self.gauges.corrupt_reads())
        yield counter("casfs_fold_bytes", "bytes folds stored as new blobs", c.fold_bytes)
        folds = HistogramMetricFamily("casfs_fold_seconds", "folds of snapshots into blobs", labels=["mount"])
        folds.add_metric(m, c.fold_seconds.cumulative(), c.fold_seconds.sum)
        yield folds
        fetch = HistogramMetricFamily("casfs_blob_fetch_seconds", "time to fetch a blob", labels=["mount"])
        fetch.add_metric(m, c.fetch_seconds.cumulative(), c.fetch_seconds.sum)
        yield fetch
        opens = CounterMetricFamily(
            "casfs_passthrough_opens",
            "opens the kernel serves from a backing file itself (their bytes are not in casfs_read_bytes)",
            labels=["mount", "backing"],
        )
        for backing, n in sorted(c.passthrough_opens.items()):
            opens.add_metric([self.mount, backing], n)
        yield opens
        yield from _file_cache_families(self.mount, self.file_cache())
        reading = self.gauges.store()
        queue = GaugeMetricFamily("casfs_queue_jobs", "jobs of the store's work queue", labels=["state"])
        for state, n in sorted(reading.queue.items()):
            queue.add_metric([state], n)
        yield queue
        volume = GaugeMetricFamily(
            "casfs_volume_bytes", "a volume's figures (logical, stored, unique)", labels=["volume", "figure"]
        )
        for name, figures in reading.volumes:
            for figure, value in figures.items():
                volume.add_metric([name, figure], value)
        yield volume


def _file_cache_families(mount: str, fc: FileCacheReading | None) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if fc is None:
        return
    m = [mount]
    for name, doc, value in (
        ("casfs_file_cache_files", "files in the whole-file cache", fc.files),
        ("casfs_file_cache_bytes", "disk the whole-file cache takes", fc.disk_bytes),
        ("casfs_file_cache_limit_bytes", "the whole-file cache's bound", fc.limit_bytes),
        ("casfs_file_cache_fills_queued", "background fills waiting", fc.queued),
    ):
        gauge = GaugeMetricFamily(name, doc, labels=["mount"])
        gauge.add_metric(m, value)
        yield gauge
    for name, doc, by_when in (
        ("casfs_file_cache_fills", "files filled into the whole-file cache", fc.fills),
        ("casfs_file_cache_fill_bytes", "bytes of the files filled", fc.fill_bytes),
    ):
        family = CounterMetricFamily(name, doc, labels=["mount", "when"])
        for when, value in sorted(by_when.items()):
            family.add_metric([mount, when], value)
        yield family
    for name, doc, value in (
        ("casfs_file_cache_fill_failures", "background fills that failed", fc.fill_failures),
        ("casfs_file_cache_too_large", "files larger than the cache's bound, not cached", fc.too_large),
        (
            "casfs_file_cache_served_from_fills_bytes",
            "bytes the daemon read from fills in flight instead of the packs",
            fc.served_from_fills_bytes,
        ),
    ):
        counter = CounterMetricFamily(name, doc, labels=["mount"])
        counter.add_metric(m, value)
        yield counter


class RpcCounts:
    """What `casfs csi serve` counts: each RPC's latency by method, and its outcome by
    method and gRPC status code. (Updated from grpc's worker threads: a lock, taken for
    a few dict operations per RPC, which costs next to nothing beside an RPC's ms.)"""

    def __init__(self) -> None:
        self.requests: dict[str, Histogram] = {}
        self.codes: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def rpc(self, method: str, code: str, seconds: float) -> None:
        with self._lock:
            h = self.requests.get(method)
            if h is None:
                h = self.requests[method] = Histogram()
            h.observe(seconds)
            self.codes[(method, code)] = self.codes.get((method, code), 0) + 1


class RpcCollector:
    """The samples of one CSI plugin process."""

    def __init__(self, node: str, c: RpcCounts) -> None:
        self.node, self.c = node, c

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        with self.c._lock:
            requests = {m: (h.cumulative(), h.sum) for m, h in self.c.requests.items()}
            codes = dict(self.c.codes)
        seconds = HistogramMetricFamily(
            "casfs_csi_request_seconds", "CSI RPCs served, by method", labels=["node", "method"]
        )
        for method, (buckets, total) in sorted(requests.items()):
            seconds.add_metric([self.node, method], buckets, total)
        yield seconds
        outcomes = CounterMetricFamily(
            "casfs_csi_requests", "CSI RPCs by method and status code", labels=["node", "method", "code"]
        )
        for (method, code), n in sorted(codes.items()):
            outcomes.add_metric([self.node, method, code], n)
        yield outcomes


def parse_address(text: str) -> tuple[str, int]:
    """ADDR:PORT (ADDR may be empty: loopback) -> (address, port); ValueError if not."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"invalid metrics address {text!r}: ADDR:PORT, e.g. 127.0.0.1:9101")
    return host.strip("[]") or "127.0.0.1", int(port)


def serve(address: tuple[str, int], collector: CasfsCollector | RpcCollector) -> Callable[[], None]:
    """Serve the exposition on `address` (a thread of prometheus_client's); the stop."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, thread = start_http_server(address[1], address[0], registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop


def store_gauges(store: str, blobs: BlobStore, corrupt_reads: Callable[[], int]) -> Gauges:
    """Gauges of a store read at each scrape, through a catalog connection of the
    scraping thread's own (a SQLite connection has one owner: the daemon's stays on its
    trio thread) and the daemon's blob store, lent (a store on S3 is not reached again)."""

    def read() -> StoreReading:
        from casfs.lifecycle.queue import status
        from casfs.refcount.accounts import volume_listing
        from casfs.volumes import list_volumes

        with _repository(store, blobs) as repo:  # (the kept figures: O(volumes) a scrape)
            st = status(repo)
            listing = volume_listing(repo, [v.name for v in list_volumes(repo)])
        return StoreReading(
            {"running": len(st.running), "waiting": len(st.waiting)},
            [
                (name, {"logical": f.logical, "stored": f.stored, "unique": f.unique, "written": f.written})
                for name, f in listing.items()
            ],
        )

    return Gauges(corrupt_reads, read)


@contextlib.contextmanager
def _repository(store: str, blobs: BlobStore) -> Iterator[Repository]:
    from casfs.repo import Repository

    repo = Repository.open(store, blobs)
    try:
        yield repo
    finally:
        repo.close(keep_blobs=True)
