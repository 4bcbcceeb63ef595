"""`casfs snapshot …`: create, ls, rm, export."""

from __future__ import annotations

from typing import TYPE_CHECKING

from casfs.cli.output import figure, page, print_json, table, when
from casfs.cli.store import check_dest, open_store
from casfs.errors import UsageError
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
    from casfs.refcount.accounts import settle, snapshot_figures
    from casfs.volumes import list_snapshots

    after, limit = page(args, numbered=True)
    with open_store(args) as repo:
        snaps = [s for s in list_snapshots(repo, args.volume) if after is None or s.n > int(after)]
        snaps = snaps[:limit]
        settle(repo, [f"snapshot:{s.volume}@{s.n}" for s in snaps])
        docs = []
        for s in snaps:
            f = snapshot_figures(repo, s.volume, s.n, budget=None).to_json()
            docs.append({**s.to_json(), **{k: f[k] for k in ("stored", "written", "unique", "pending")}})
        if args.json:
            print_json(docs)
        else:
            rows = [
                [
                    f"{d['volume']}@{d['n']}",
                    format_size(d["size"]),
                    figure(d, "stored"),
                    figure(d, "written"),
                    figure(d, "unique"),
                    when(d["created"]),
                    (d["label"] or "-") + ("" if d["folded"] else " (folding)"),
                ]
                for d in docs
            ]
            table(
                ["SNAPSHOT", "SIZE", "STORED", "WRITTEN", "UNIQUE", "CREATED", "LABEL"],
                rows,
                right=["SIZE", "STORED", "WRITTEN", "UNIQUE"],
            )
            if any(d["pending"] for d in docs):
                print("~ an estimate, not counted since a change (`casfs gc` counts every figure)")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from casfs.volumes import remove_snapshot

    with open_store(args, frees=True) as repo:
        if remove_snapshot(repo, args.ref, if_exists=args.if_exists):
            print(f"removed snapshot {args.ref}")
        else:
            print(f"no snapshot {args.ref}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from casfs.volumes.prune import KeepPolicy, prune_volume

    policy = KeepPolicy(
        *(_count(getattr(args, f"keep_{rule}"), rule) for rule in ("last", "hourly", "daily"))
    )
    with open_store(args, frees=not args.dry_run) as repo:
        done = prune_volume(repo, args.volume, policy, dry_run=args.dry_run)
    if args.json:
        print_json({**done.to_json(), "dry_run": args.dry_run})
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for n, why in sorted(done.kept.items()):
        print(f"keep   {done.volume}@{n} ({', '.join(why)})")
    for n in done.removed:
        print(f"{verb} {done.volume}@{n}")
    return 0


def _count(text: str | None, rule: str) -> int | None:
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"invalid --keep-{rule} {text!r}: a whole number >= 1")
    return int(text)


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
