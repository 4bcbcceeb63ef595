"""`casfs status`: the store and its running mounts at a glance, for a person (or --json):
what the store holds, damage recorded, the queue, the last scheduled scrub, and each
mount's figures from its metrics endpoint (the same numbers a Prometheus scrape gets)."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import TYPE_CHECKING, Any

from casfs.cli.output import print_json
from casfs.cli.store import open_store
from casfs.units import format_size

if TYPE_CHECKING:
    import argparse

# The figures `casfs status` shows of a mount, summed over their labels.
SHOWN = (
    "casfs_fuse_request_seconds_count",
    "casfs_read_bytes_total",
    "casfs_written_bytes_total",
    "casfs_chunk_cache_hits_total",
    "casfs_chunk_cache_misses_total",
    "casfs_corrupt_reads_total",
)


def cmd_status(args: argparse.Namespace) -> int:
    from casfs import images, volumes
    from casfs.fuse.launcher import running_mounts
    from casfs.lifecycle.queue import status
    from casfs.upkeep.scheduled import last_path

    with open_store(args) as repo:
        vols = volumes.list_volumes(repo)
        doc: dict[str, Any] = {
            "store": str(repo.path),
            "images": len(images.list_images(repo)),
            "volumes": len(vols),
            "snapshots": sum(len(volumes.list_snapshots(repo, v.name)) for v in vols),
            "damaged": len(repo.blobs.damaged()),
        }
        q = status(repo)
        doc["queue"] = {"running": len(q.running), "waiting": len(q.waiting), "limit": q.limit}
        try:
            doc["last_scrub"] = json.loads(last_path(repo.path).read_text())
        except (OSError, ValueError):
            doc["last_scrub"] = None
        doc["mounts"] = [
            {
                "mountpoint": r.get("mountpoint"),
                "pid": r.get("pid"),
                "volume": r.get("volume"),
                "read_only": r.get("read_only"),
                "metrics": _scrape(r.get("metrics")),
            }
            for r in running_mounts(repo.path)
        ]
    if args.json:
        print_json(doc)
    else:
        _show(doc)
    return 0


def _scrape(address: str | None) -> dict[str, float] | None:
    """A mount's figures from its metrics endpoint (SHOWN, summed), or None: it has none
    or did not answer within a second."""
    if not address:
        return None
    from prometheus_client.parser import text_string_to_metric_families

    from casfs.metrics import parse_address

    host, port = parse_address(address)
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=1.0) as r:
            text = r.read().decode()
    except OSError:
        return None
    sums = dict.fromkeys(SHOWN, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
    return sums


def _show(doc: dict[str, Any]) -> None:
    print(
        f"store {doc['store']}: {doc['images']} images, {doc['volumes']} volumes, "
        f"{doc['snapshots']} snapshots; {doc['damaged']} damaged blob(s) recorded"
    )
    q = doc["queue"]
    print(f"queue: {q['running']} running, {q['waiting']} waiting (limit {q['limit']})")
    last = doc["last_scrub"]
    if last is None:
        print("scheduled scrub: none yet (casfs config set scrub.every 7d)")
    else:
        ago = (time.time() - float(last["ended"])) / 3600
        print(f"scheduled scrub: {ago:.1f} h ago, {last['blobs']} blobs, {len(last['damaged'])} damaged")
    for m in doc["mounts"]:
        what = f"volume {m['volume']}" if m["volume"] else "the whole store"
        line = f"mount {m['mountpoint']} (pid {m['pid']}, {what}{', read-only' if m['read_only'] else ''})"
        f = m["metrics"]
        if f is not None:
            hits, misses = f["casfs_chunk_cache_hits_total"], f["casfs_chunk_cache_misses_total"]
            rate = f"{100 * hits / (hits + misses):.0f}%" if hits + misses else "-"
            line += (
                f": {int(f['casfs_fuse_request_seconds_count'])} requests, "
                f"{format_size(int(f['casfs_read_bytes_total']))} read, "
                f"{format_size(int(f['casfs_written_bytes_total']))} written, chunk cache {rate} hits, "
                f"{int(f['casfs_corrupt_reads_total'])} corrupt reads"
            )
        print(line)
