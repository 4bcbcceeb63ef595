"""`casfs snapshot send`, `casfs snapshot receive`, `casfs pull` and `casfs serve-replica`:
moving snapshots between stores (casfs.replica)."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

from casfs.cli.output import print_json
from casfs.cli.store import open_store
from casfs.errors import UsageError
from casfs.units import format_size, parse_rate, parse_snapshot_ref

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator

    from casfs.cli.output import Progress
    from casfs.replica.land import Moved


def _report(moved: Moved, as_json: bool, verb: str, image: bool = False) -> None:
    from casfs.replica.land import Plan

    what = f"image {moved.volume}" if image else f"{moved.volume}@{moved.n}"
    if as_json:
        print_json(moved.to_json())
    elif moved.plan == Plan.HAVE:
        print(f"already have {what} (root {moved.root}): nothing to do")
    elif moved.adopted or moved.copied:
        copied = f", {moved.copied} copied from it" if moved.copied else ""
        print(
            f"{verb} {what} (root {moved.root}): {moved.adopted} blobs adopted "
            f"through the bucket{copied}, {format_size(moved.bytes + moved.bucket_bytes)} moved"
        )
    else:
        print(f"{verb} {what} (root {moved.root}): {moved.blobs} blobs, {format_size(moved.bytes)} moved")


def cmd_send(args: argparse.Namespace) -> int:
    from casfs.replica.stream import send

    volume, n = parse_snapshot_ref(args.ref)
    since = None
    if args.since is not None:
        base, since = parse_snapshot_ref(args.since)
        if base != volume or since >= n:
            raise UsageError(f"--since must name an older snapshot of {volume}, not {args.since}")
    if sys.stdout.isatty():
        raise UsageError("refusing to write a snapshot stream to a terminal: redirect or pipe it")
    from casfs.replica.wire import widen

    widen(sys.stdout.fileno())
    with open_store(args) as repo:
        send(repo, volume, n, since, sys.stdout.buffer)
    return 0


def cmd_receive(args: argparse.Namespace) -> int:
    from casfs.replica.stream import receive

    if sys.stdin.isatty():
        raise UsageError("a snapshot stream is read from stdin: pipe `casfs snapshot send` into it")
    with open_store(args) as repo:
        moved = receive(repo, sys.stdin.buffer, args.as_name)
    _report(moved, args.json, "received")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from casfs.replica.peers import Connection

    n = None
    if args.snapshot is not None:
        if not args.snapshot.isdigit() or int(args.snapshot) < 1:
            raise UsageError(f"invalid snapshot number {args.snapshot!r}")
        n = int(args.snapshot)
    bwlimit = None if args.bwlimit is None else parse_rate(args.bwlimit)
    # The source starts first: this side's imports and store run while ssh connects.
    with Connection(args.source, args.remote_casfs, bwlimit) as conn:
        from casfs.ids import SnapshotNo
        from casfs.replica.pull import pull

        with _progress(f"pull {args.volume}") as bar, open_store(args) as repo:
            moved = pull(repo, conn, args.volume, None if n is None else SnapshotNo(n), args.as_name, bar)
    _report(moved, args.json, "pulled")
    return 0


def cmd_image_pull(args: argparse.Namespace) -> int:
    from casfs.replica.peers import Connection

    with Connection(args.source, args.remote_casfs) as conn:
        from casfs.replica.image import pull_image

        with _progress(f"pull {args.image}") as bar, open_store(args) as repo:
            moved = pull_image(repo, conn, args.image, args.as_name, bar)
    _report(moved, args.json, "pulled", image=True)
    return 0


@contextlib.contextmanager
def _progress(what: str) -> Iterator[Progress | None]:
    """A progress bar on a terminal (closed however the transfer ends), else None."""
    if not sys.stderr.isatty():
        yield None
        return
    from casfs.cli.output import Progress

    bar = Progress(what, None, sys.stderr)
    try:
        yield bar
    finally:
        bar.close()


def cmd_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.listen is not None:
        from casfs.errors import CasfsError, NotFound
        from casfs.replica.listen import listen

        try:
            listen(Path(args.path), args.listen, args.idle)
        except CasfsError as e:
            if not args.stdio or isinstance(e, NotFound):
                raise
            print(f"not listening: {e}", flush=True)  # (this session is served all the same)
        if not args.stdio:
            return 0
    from casfs.replica.serve import serve
    from casfs.repo import Repository
    from casfs.upkeep.recovery import recover

    repo = Repository.open(Path(args.path))
    try:
        for message in recover(repo):
            print(f"casfs: recovered: {message}", file=sys.stderr)
        from casfs.replica.wire import widen

        widen(sys.stdout.fileno())
        serve(repo, sys.stdin.buffer, sys.stdout.buffer)
    finally:
        repo.close()
    return 0
