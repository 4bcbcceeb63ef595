"""`casfs snapshotter serve`: the containerd snapshotter (casfs.snapshotter.server).
Only this command loads grpc."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from casfs.errors import UsageError
    from casfs.repo import store_path
    from casfs.snapshotter.server import serve

    if not args.address:
        raise UsageError("an address is required (--address unix:///PATH)")
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return serve(str(store_path(args.store)), args.address, args.root)


def cmd_prime(args: argparse.Namespace) -> int:
    from casfs.cli.output import print_json
    from casfs.cli.store import open_store
    from casfs.errors import UsageError
    from casfs.snapshotter.prime import prime

    if not args.containerd:
        raise UsageError("containerd's socket is required (--containerd unix:///PATH)")
    with open_store(args) as repo:
        done = prime(repo, args.image, args.containerd, args.namespace, args.snapshotter, args.expires)
    if args.json:
        print_json([{"chain_id": p.chain_id, "already": p.already} for p in done])
    else:
        for p in done:
            print(f"{p.chain_id}: {'already in containerd' if p.already else 'primed'}")
    return 0
