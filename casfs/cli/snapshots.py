"""`casfs snapshot …`: create, ls, rm, export."""

from __future__ import annotations

from typing import TYPE_CHECKING

from casfs.cli.output import check_unreadable, print_json, table, when
from casfs.cli.store import check_dest, open_store
from casfs.units import format_size, parse_snapshot_ref

if TYPE_CHECKING:
    import argparse


def cmd_create(args: argparse.Namespace) -> int:
    from casfs.volumes import create_snapshot

    with open_store(args) as repo:
        n = create_snapshot(repo, args.volume, label=args.label)
    print(n)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from casfs.refcount.usage import snapshot_usage
    from casfs.volumes import list_snapshots

    with open_store(args) as repo:
        docs = []
        for s in list_snapshots(repo, args.volume):
            u = snapshot_usage(repo, s.volume, s.n)
            docs.append(
                {**s.to_json(), "stored": u.stored, "unique": u.unique, "unreadable_blobs": u.unreadable}
            )
        if args.json:
            print_json(docs)
        else:
            rows = [
                [
                    f"{d['volume']}@{d['n']}",
                    format_size(d["size"]),
                    format_size(d["stored"]),
                    format_size(d["unique"]),
                    when(d["created"]),
                    (d["label"] or "-") + ("" if d["folded"] else " (folding)"),
                ]
                for d in docs
            ]
            table(
                ["SNAPSHOT", "SIZE", "STORED", "UNIQUE", "CREATED", "LABEL"],
                rows,
                right=["SIZE", "STORED", "UNIQUE"],
            )
        check_unreadable(docs)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from casfs.volumes import remove_snapshot

    with open_store(args, frees=True) as repo:
        if remove_snapshot(repo, args.ref, if_exists=args.if_exists):
            print(f"removed snapshot {args.ref}")
        else:
            print(f"no snapshot {args.ref}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from casfs.catalog.volumes import snapshot_row
    from casfs.errors import NotFound
    from casfs.images import export_root
    from casfs.volumes.settle import wait_folded

    volume, n = parse_snapshot_ref(args.ref)
    dest = Path(args.dest)
    with open_store(args) as repo:
        wait_folded(repo, volume, n)
        snap = snapshot_row(repo.conn, volume, n)
        if snap is None:
            raise NotFound(f"no snapshot {volume}@{n}")
        check_dest(dest)
        fmt = export_root(repo, snap.kind, snap.root, snap.chunk_size, dest, args.format)
    print(f"exported snapshot {volume}@{n} to {dest} ({fmt})")
    return 0
