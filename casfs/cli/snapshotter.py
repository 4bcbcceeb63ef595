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
