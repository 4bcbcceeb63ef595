"""`casfs volume …` (create, ls, info, rm, resize, export) and `casfs rollback`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from casfs.cli.output import figure, keyvalues, page, phase, print_json, ratio, table, warn, when
from casfs.cli.store import check_dest, open_store, store_footer
from casfs.errors import UsageError
from casfs.units import format_duration, format_size, parse_duration, parse_size

if TYPE_CHECKING:
    import argparse
    from typing import Any

    from casfs.repo import Repository
    from casfs.volumes import VolumeInfo


def _docs(repo: Repository, infos: list[VolumeInfo]) -> list[dict[str, Any]]:
    """Each volume's fields and kept figures (pending ones settled within the budget)."""
    from casfs.refcount.accounts import settle, volume_listing

    settle(repo, [f"volume:{v.name}" for v in infos])
    figures = volume_listing(repo, [v.name for v in infos])
    return [{**v.to_json(), **figures[v.name].to_json()} for v in infos if v.name in figures]


def cmd_create(args: argparse.Namespace) -> int:
    from casfs.volumes import Source, create_volume

    if args.source is not None:
        source = Source(snapshot=args.source) if "@" in args.source else Source(image=args.source)
    elif args.blank_dir:
        source = Source(blank_dir=True)
    else:
        source = Source(blank_block=parse_size(args.blank_block))
    grace = parse_duration(args.grace) if args.grace is not None else None
    with open_store(args) as repo:
        info, created = create_volume(repo, args.name, source, read_only=args.ro, grace_s=grace)
    if created:
        print(
            f"created volume {info.name} ({info.kind}, {info.mode}, {format_size(info.size)}) "
            f"from {info.origin}"
        )
    else:
        print(f"volume {info.name} already exists with the same spec")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from casfs.volumes import list_volumes

    after, limit = page(args)
    with open_store(args) as repo:
        docs = _docs(repo, list_volumes(repo, after=after, limit=limit))
        if args.json:
            print_json(docs)
        else:
            rows = [
                [
                    d["name"],
                    d["kind"],
                    d["mode"],
                    d["phase"],
                    str(d["owner_pid"] or "-"),
                    format_size(d["size"]),
                    figure(d, "stored"),
                    figure(d, "written"),
                    figure(d, "unique"),
                    ratio(d["logical"], d["stored"]),
                    d["origin"],
                    str(len(d["snapshots"])),
                ]
                for d in docs
            ]
            table(
                [
                    "NAME",
                    "KIND",
                    "MODE",
                    "PHASE",
                    "PID",
                    "SIZE",
                    "STORED",
                    "WRITTEN",
                    "UNIQUE",
                    "RATIO",
                    "ORIGIN",
                    "SNAPSHOTS",
                ],
                rows,
                right=["SIZE", "STORED", "WRITTEN", "UNIQUE", "RATIO", "SNAPSHOTS"],
            )
            store_footer(repo, docs)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from casfs.volumes import describe_unsaved, get_volume

    with open_store(args) as repo:
        [d] = _docs(repo, [get_volume(repo, args.name)])
        replicas = _replica_lines(repo, d)
        if args.json:
            print_json(d)
        else:
            keyvalues(
                [
                    ("name", d["name"]),
                    ("kind", d["kind"]),
                    ("mode", d["mode"]),
                    ("phase", phase(d)),
                    ("origin", d["origin"]),
                    ("size", f"{format_size(d['size'])} ({d['size']} bytes)"),
                    ("logical", f"{format_size(d['logical'])} (the volume and its snapshots)"),
                    ("stored", _exact(d, "stored", "")),
                    ("written", _exact(d, "written", ", not in its origin")),
                    ("unique", _exact(d, "unique", ", freed by rm + gc")),
                    ("ratio", f"{ratio(d['logical'], d['stored'])} (logical / stored)"),
                    ("local", _local(repo, d["local"])),
                    ("chunk size", format_size(d["chunk_size"])),
                    ("base", d["base"]),
                    ("created", when(d["created"])),
                    ("last used", when(d["last_used"]) if d["last_used"] else None),
                    ("grace", _grace(d)),
                    ("snapshots", ", ".join(map(str, d["snapshots"]))),
                    ("NOT SAVED", describe_unsaved(d["unsaved"]) if d["unsaved"] else None),
                    *replicas,
                ]
            )
    return 0


def _exact(d: dict[str, Any], key: str, what: str) -> str:
    """A figure for `info`, with its bytes and whether it is an estimate."""
    pending = " (an estimate: `casfs gc` counts it)" if key in d["pending"] else ""
    return f"{figure(d, key)} ({d[key]} bytes{what}){pending}"


def _local(repo: Repository, local: int) -> str | None:
    """Data in upper files (folded into blobs by the next snapshot, or unmount)."""
    if not local:
        return None
    where = "not yet uploaded" if (repo.path / "blobs.json").exists() else "not yet blobs"
    return f"{format_size(local)} ({local} bytes written since the last fold, on this host only: {where})"


def _grace(d: dict[str, Any]) -> str | None:
    if d["grace_s"] is None:
        return None
    since = d["last_used"] or d["created"]
    left = since + d["grace_s"] - time.time()
    when = (
        f"removed by gc in {format_duration(round(left))}" if left > 0 else "expired: the next gc removes it"
    )
    return f"{format_duration(d['grace_s'])} (ephemeral; {when})"


def cmd_rm(args: argparse.Namespace) -> int:
    from casfs.volumes import remove_volume

    with open_store(args, frees=True) as repo:
        if args.if_replicated is not None:
            _check_replicated(repo, args.name, args.if_replicated)
        if remove_volume(repo, args.name, if_exists=args.if_exists):
            print(f"removed volume {args.name} and its snapshots (`casfs gc` frees their unique blobs)")
        else:
            print(f"no volume {args.name}")
    return 0


def _check_replicated(repo: Repository, name: str, k: str) -> None:
    """--if-replicated K: K known peers must hold, asked now, a snapshot as new as ours."""
    from casfs.catalog.volumes import volume_row
    from casfs.replica.status import check_replicated

    if not k.isdigit() or int(k) < 1:
        raise UsageError(f"invalid --if-replicated {k!r}: expected an integer >= 1")
    if volume_row(repo.conn, name) is not None:  # (absent: rm says so, or --if-exists)
        for source in check_replicated(repo, name, int(k)):
            print(f"replicated at {source}")


def _replica_lines(repo: Repository, d: dict[str, Any]) -> list[tuple[str, object]]:
    """`volume info`'s replica lines: the newest snapshot, where each came from, the peers."""
    from casfs.replica.status import replica_doc

    r = replica_doc(repo, d["name"])
    d.update(r)
    lines: list[tuple[str, object]] = [("newest snapshot", r["newest_snapshot"])]
    for n, s in r["snapshot_sources"].items():
        where = "taken here" if s["source"] is None else f"from {s['source']} ({when(s['received'])})"
        lines.append(
            (
                f"snapshot {n}",
                where if s["taken_by"] == r["store_id"] else f"{where}, taken by {s['taken_by']}",
            )
        )
    for p in r["peers"]:
        lines.append(
            (f"peer {p['source']}", f"newest {p['remote']}@{p['newest']} when seen {when(p['seen'])}")
        )
    return lines


def cmd_resize(args: argparse.Namespace) -> int:
    from casfs.volumes import resize

    size = parse_size(args.size)
    with open_store(args) as repo:
        old = resize(repo, args.name, size, allow_shrink=args.allow_shrink)
    print(f"resized volume {args.name}: {format_size(old)} -> {format_size(size)}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from casfs.images import export_root
    from casfs.lifecycle.phases import VolumePhase
    from casfs.store.ids import BlobId
    from casfs.volumes import get_volume
    from casfs.volumes.settle import settle  # (the function: the package's `settle` may be the module)

    dest = Path(args.dest)
    with open_store(args) as repo:
        v = get_volume(repo, args.name)
        if v.phase == VolumePhase.MOUNTED and v.mode == "rw":
            warn(f"volume {v.name} is mounted read/write: exporting its last folded state (its base)")
        elif settle(repo, v.name) is not None:  # a crashed mount's changes: fold, don't drop
            v = get_volume(repo, args.name)
        check_dest(dest)
        fmt = export_root(repo, v.kind, BlobId(bytes.fromhex(v.base)), v.chunk_size, dest, args.format)
    print(f"exported volume {args.name} to {dest} ({fmt})")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from casfs.ids import SnapshotNo
    from casfs.volumes import rollback

    n = SnapshotNo(_positive_int(args.n, "snapshot number"))
    with open_store(args) as repo:
        rollback(repo, args.volume, n)
    print(f"rolled volume {args.volume} back to snapshot {n}")
    return 0


def _positive_int(text: str, what: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"invalid {what} {text!r}: expected an integer >= 1")
    return int(text)
