"""The store's upkeep: `casfs init`, `fsck`, `gc`, `queue ls` and `config …`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from casfs.cli.output import error, print_json, table, warn
from casfs.cli.store import open_store
from casfs.errors import UsageError
from casfs.units import format_size, parse_size

if TYPE_CHECKING:
    import argparse

    from casfs.repo import Repository


def cmd_init(args: argparse.Namespace) -> int:
    from pathlib import Path

    from casfs.repo import Repository, store_path

    path = Path(store_path(args.store))
    existed = (path / "catalog.db").exists()
    blobs = getattr(args, "blobs", None)
    cache = getattr(args, "blob_cache", None)
    if cache is not None and blobs is None:
        raise UsageError("--blob-cache needs --blobs")
    Repository.init(path, blob_url=blobs, blob_cache=parse_size(cache) if cache else None).close()
    where = f" with blobs in {blobs}" if blobs else ""
    print(f"casfs store at {path}{where} {'already exists' if existed else 'created'}")
    return 0


def cmd_fsck(args: argparse.Namespace) -> int:
    import dataclasses

    from casfs.lifecycle.queue import job_slot
    from casfs.refcount.fsck import fsck

    sample = _fraction(args.sample)
    with open_store(args) as repo, job_slot(repo, "fsck --repair" if args.repair else "fsck"):
        report = fsck(repo, repair=args.repair, sample=sample)
    remaining = [p for p in report.problems if not p.repaired]
    if args.json:
        print_json({**dataclasses.asdict(report), "clean": report.clean, "remaining": len(remaining)})
    else:
        for p in report.problems:
            print(f"{p.kind:<10} {p.blob}  {p.message}{'  [repaired]' if p.repaired else ''}")
        print(
            f"checked {report.rows} blob rows, re-hashed {report.blobs_checked} blobs "
            f"({format_size(report.bytes_checked)}); {len(report.problems)} problem(s), "
            f"{len(report.problems) - len(remaining)} repaired"
        )
    if remaining:
        how = "" if args.repair else "; `casfs fsck --repair` fixes counts and orphans"
        error(f"{len(remaining)} problem(s) found in the store{how}")
        return 5
    return 0


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise UsageError(f"invalid sample {text!r}: a fraction in (0, 1]")
    return value


def cmd_gc(args: argparse.Namespace) -> int:
    import dataclasses

    from casfs.lifecycle.ephemeral import expire
    from casfs.lifecycle.queue import job_slot
    from casfs.refcount.accounts import refresh
    from casfs.refcount.gc import gc

    kept: list[str] = []
    with open_store(args) as repo, job_slot(repo, "gc"):
        expired = expire(repo, kept=kept)  # first: what they held is freed by this gc
        report = gc(repo)
        repacked, reclaimed = _repack(repo, args.repack_below)
        counted = refresh(repo)  # (after gc: no garbage left for the counts to walk)
    for why in kept:
        warn(f"ephemeral volume {why}: kept")
    if args.json:
        print_json(
            {
                **dataclasses.asdict(report),
                "expired_volumes": expired,
                "packs_repacked": repacked,
                "bytes_repacked": reclaimed,
                "figures_counted": counted,
            }
        )
    else:
        for name in expired:
            print(f"removed ephemeral volume {name}: unused for longer than its grace period")
        print(
            f"freed {report.blobs_freed} blobs and {report.orphan_files_removed} orphan files: "
            f"{format_size(report.bytes_freed)}"
        )
        if repacked:
            print(f"repacked {repacked} packs: {format_size(reclaimed)} reclaimed")
    for p in report.problems:
        warn(f"{p} (run `casfs fsck`)")
    return 0


def _repack(repo: Repository, below: float) -> tuple[int, int]:
    """A pack store's repack (BlobStore.compact), under the store's exclusive lock; the
    file store has nothing to do. Skipped with a warning when writers keep the lock."""
    from casfs.errors import Busy
    from casfs.store import BlobStore

    if type(repo.blobs).compact is BlobStore.compact:
        return 0, 0
    try:
        lock = repo.exclusive_lock()
    except Busy:
        warn("the store is busy: packs not repacked (the next gc will)")
        return 0, 0
    try:
        return repo.blobs.compact(below)
    finally:
        lock.release()


def cmd_queue_ls(args: argparse.Namespace) -> int:
    from casfs.lifecycle.queue import status

    with open_store(args) as repo:
        st = status(repo)
    if args.json:
        print_json(st.to_json())
        return 0
    now = time.time()
    rows = [
        [
            "-" if j.slot is None else str(j.slot),
            "waiting" if j.slot is None else "running",
            str(j.pid),
            f"{now - j.since:.1f}s",
            j.what,
        ]
        for j in [*st.running, *st.waiting]
    ]
    table(["SLOT", "STATE", "PID", "FOR", "JOB"], rows, right=["FOR"])
    print(f"\n{len(st.running)} running, {len(st.waiting)} waiting, limit {st.limit}")
    return 0


def cmd_config_get(args: argparse.Namespace) -> int:
    from casfs.lifecycle import config

    with open_store(args) as repo:
        v = config.effective(repo.conn, args.key)
    if args.json:
        print_json(v)
    else:
        print(v.value)
    return 0


def cmd_config_set(args: argparse.Namespace) -> int:
    from casfs.lifecycle import config

    with open_store(args) as repo:
        value = config.set_value(repo.conn, args.key, args.value)
        v = config.effective(repo.conn, args.key)
    print(f"{args.key} = {value}")
    if v.source.startswith("env:"):
        warn(f"${v.source[4:]} overrides it in this environment ({v.value})")
    return 0


def cmd_config_unset(args: argparse.Namespace) -> int:
    from casfs.lifecycle import config

    with open_store(args) as repo:
        config.unset_value(repo.conn, args.key)
        v = config.effective(repo.conn, args.key)
    print(f"{args.key} = {v.value} ({v.source})")
    return 0


def cmd_config_ls(args: argparse.Namespace) -> int:
    from casfs.lifecycle import config

    with open_store(args) as repo:
        values = [config.effective(repo.conn, key) for key in sorted(config.SETTINGS)]
    if args.json:
        print_json(values)
    else:
        table(
            ["KEY", "VALUE", "FROM", "MEANING"],
            [[v.key, v.value, v.source, config.SETTINGS[v.key].help] for v in values],
        )
    return 0
