"""`casfs csi serve`: the CSI plugin (casfs.csi.server). Only this command loads grpc."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from casfs.csi.server import serve
    from casfs.repo import store_path

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from casfs.units import parse_size

    bwlimit = None if args.bwlimit is None else parse_size(args.bwlimit)
    return serve(
        store_path(args.store), args.endpoint, args.node_id, args.services, args.max_volumes, args.metrics,
        args.registry, args.reach, bwlimit,
    )  # fmt: skip
