"""The store's upkeep: `casfs init`, `fsck`, `gc`, `queue ls` and `config …`."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

from casfs.cli.output import error, print_json, table, warn
from casfs.cli.store import keep_reserve, open_store, reserve_size
from casfs.errors import Corruption, UsageError
from casfs.units import format_size, parse_size

if TYPE_CHECKING:
    import argparse

    from casfs.refcount.fsck import FsckReport
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
    with contextlib.closing(
        Repository.init(path, blob_url=blobs, blob_cache=parse_size(cache) if cache else None)
    ) as repo:
        keep_reserve(repo)
    where = f" with blobs in {blobs}" if blobs else ""
    print(f"casfs store at {path}{where} {'already exists' if existed else 'created'}")
    return 0


def cmd_fsck(args: argparse.Namespace) -> int:
    import dataclasses

    from casfs.lifecycle.queue import job_slot
    from casfs.refcount.fsck import fsck

    sample = _fraction(args.sample)
    if args.heal_from and not args.repair:
        raise UsageError("--heal-from repairs: give --repair too")
    with open_store(args) as repo, job_slot(repo, "fsck --repair" if args.repair else "fsck"):
        report = fsck(repo, repair=args.repair, sample=sample)
        if args.heal_from:
            _heal(repo, report, args.heal_from)
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
        return Corruption.exit_code
    return 0


def _heal(repo: Repository, report: FsckReport, source: str) -> None:
    """Missing and corrupt blobs fsck found, fetched from `source` by their ids (as
    `casfs scrub --heal-from` does): marked repaired once they read back right."""
    from casfs.catalog import blobs as blob_rows
    from casfs.kinds import BlobKind
    from casfs.replica.peers import blob_fetcher
    from casfs.store.ids import BlobId
    from casfs.upkeep.scrub import heal_blobs

    bad = [p for p in report.problems if p.kind in ("missing", "corrupt") and not p.repaired]
    ids = [BlobId(bytes.fromhex(p.blob)) for p in bad]
    kinds = {bid: BlobKind(row.kind) for bid, row in blob_rows.rows_of(repo.conn, ids)}
    with blob_fetcher(source) as fetch:
        healed = heal_blobs(repo, [(bid, kinds[bid]) for bid in ids if bid in kinds], source, fetch)
    for problem, bid in zip(bad, ids, strict=True):
        why_not = healed.get(bid, "no catalog row says what kind of blob it is")
        problem.repaired = why_not is None
        problem.message += f" (healed from {source})" if why_not is None else f" (not healed: {why_not})"


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

    from casfs.lifecycle.queue import job_slot
    from casfs.refcount.accounts import refresh
    from casfs.refcount.gc import gc
    from casfs.store.reserve import short_of_room
    from casfs.upkeep.ephemeral import expire

    kept: list[str] = []
    with open_store(args, frees=True) as repo, job_slot(repo, "gc"):
        expired = expire(repo, kept=kept)  # first: what they held is freed by this gc
        report = gc(repo, small_rounds=short_of_room(repo.path, reserve_size(repo)))
        repacked, reclaimed = _repack(repo, args.repack_below)
        counted = refresh(repo)  # (after gc: no garbage left for the counts to walk)
        keep_reserve(repo)  # (last: the repack may have needed the room)
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
    except Exception as e:
        if not _no_space(e):
            raise
        warn("packs not repacked: No space left on device (gc freed what it could; the next gc repacks)")
        return 0, 0
    finally:
        lock.release()


def _no_space(e: Exception) -> bool:
    import errno

    from casfs.errors import NoSpace, of_database

    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(e, NoSpace) or isinstance(of_database(e), NoSpace)


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
