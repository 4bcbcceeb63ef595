"""What every command shares about the store: opening it (after recovery), the totals
line under a listing, and the check that an export's destination is free."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING

from casfs.cli.output import count, ratio
from casfs.units import format_size

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Sequence
    from pathlib import Path
    from typing import Any

    from casfs.repo import Repository


@contextmanager
def open_store(args: argparse.Namespace, frees: bool = False) -> Iterator[Repository]:
    """The store, after recovering what dead processes left half done (one stderr line each).
    `frees`: the command frees space (rm, gc), so on a full disk it first gives up the
    store's reserve (store.reserve), without which it could not even open the catalog."""
    from casfs.repo import Repository, store_path
    from casfs.upkeep.recovery import recover

    path = store_path(args.store)
    if frees:
        from casfs.store.reserve import release_if_full

        release_if_full(path)
    repo = Repository.open(path)
    try:
        for message in recover(repo):
            print(f"casfs: recovered: {message}", file=sys.stderr)
        _count_figures(repo)
        yield repo
    finally:
        _close(repo)


def _count_figures(repo: Repository) -> None:
    """After the upgrade to format 10 (or a crash during this): every figure counted
    once, with progress on a terminal. One indexed read otherwise."""
    from casfs.catalog import meta_value, set_meta, transaction

    if meta_value(repo.conn, "figures.recount") is None:
        return
    from casfs.refcount.accounts import refresh

    def progress(done: int, total: int) -> None:
        sys.stderr.write(f"\r\x1b[Kcounting space figures (format 10): {done}/{total}")
        sys.stderr.flush()

    refresh(repo, progress if sys.stderr.isatty() else None)
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[K")
    with transaction(repo.conn):
        set_meta(repo.conn, "figures.recount", None)


# The `casfs` program (cli.run) ends with os._exit right after its command: a store
# opened here then keeps its catalog connections open until then (Repository.close),
# so that a short command does not checkpoint the WAL, unless the WAL has grown past
# this. (Each process's first open reads the WAL back: about 1.3 M instructions per MiB.)
WAL_KEEP_BYTES = 1 << 20


class Exit:
    """What the process's end will do: set by cli.run before the command."""

    fast = False  # the process ends with os._exit (cli.run)
    catalog_left_open = False  # a store's catalog was left open for that end


def reserve_size(repo: Repository) -> int:
    from casfs.lifecycle.config import effective

    return int(effective(repo.conn, "store.reserve").value)


def keep_reserve(repo: Repository) -> None:
    """Make the store's reserve (store.reserve) if it is missing and there is room."""
    from casfs.store.reserve import keep

    keep(repo.path, reserve_size(repo))


def _close(repo: Repository) -> None:
    keep = Exit.fast and _wal_bytes(repo) < WAL_KEEP_BYTES
    repo.close(keep_catalog=keep)
    Exit.catalog_left_open |= keep


def _wal_bytes(repo: Repository) -> int:
    try:
        return os.stat(repo.catalog_path + "-wal").st_size
    except FileNotFoundError:
        return 0


def store_footer(repo: Repository, docs: Sequence[dict[str, Any]] = ()) -> None:
    """The totals line under a listing, and what the ~ of its rows means."""
    from casfs.refcount.usage import store_usage

    if any(d.get("pending") for d in docs):
        print("~ an estimate, not counted since a change (`casfs gc` counts every figure)")
    s = store_usage(repo)
    garbage = f", {format_size(s.garbage)} garbage (`casfs gc`)" if s.garbage else ""
    print(
        f"\nstore: {count(s.images, 'image')}, {count(s.volumes, 'volume')}, "
        f"{count(s.snapshots, 'snapshot')}; "
        f"logical {format_size(s.logical)}, stored {format_size(s.stored)} in {s.blobs} blobs "
        f"({ratio(s.logical, s.stored)}){garbage}"
    )


def check_dest(dest: Path) -> None:
    from casfs.errors import Conflict

    if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())):
        raise Conflict(f"{dest} already exists")
