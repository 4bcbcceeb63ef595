"""`casfs scrub`: re-hash what the store's roots reach, name what holds the damage, heal it."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from casfs.cli.output import error, print_json
from casfs.cli.store import open_store
from casfs.errors import UsageError
from casfs.units import format_size, parse_size

if TYPE_CHECKING:
    import argparse

    from casfs.repo import Repository
    from casfs.upkeep.scrub import ScrubReport


def cmd_scrub(args: argparse.Namespace) -> int:
    from casfs.lifecycle.queue import job_slot
    from casfs.upkeep import scrub

    if args.heal_from and args.heal_from_peers:
        raise UsageError("--heal-from and --heal-from-peers: one or the other")
    rate = parse_size(args.rate) if args.rate else None
    with open_store(args) as repo, job_slot(repo, "scrub"):
        todo = scrub.roots(repo, volume=args.volume, image=args.image)
        show = _progress if sys.stderr.isatty() and not args.json else None
        lock = repo.writer_lock()  # shared: writers go on, gc waits (no blob goes mid-read)
        try:
            scrubber = scrub.Scrubber(repo, rate, show)
            report = scrubber.scrub(todo, scrub.state_path(repo))
            if args.volume is None and args.image is None:
                scrubber.file_cache()
        finally:
            lock.release()
        if show is not None:
            sys.stderr.write("\r\x1b[K")
        if report.damaged and (args.heal_from or args.heal_from_peers):
            _heal(repo, report, [args.heal_from] if args.heal_from else _peer_sources(repo))
    if args.json:
        print_json(report.to_json())
    else:
        for damage in report.damaged:
            print("\n".join(scrub.describe(damage)))
        for name in report.cache_removed:
            print(f"cached file {name} removed: it no longer matches its digest (filled again when opened)")
        healed = sum(1 for d in report.damaged if d.healed_from)
        resumed = f" (resumed after {report.resumed_after})" if report.resumed_after else ""
        print(
            f"scrubbed {report.roots} root(s){resumed}, re-hashed {report.blobs} blobs "
            f"({format_size(report.bytes)}); {len(report.damaged)} damaged, {healed} healed"
        )
    if not report.clean:
        healing = args.heal_from or args.heal_from_peers
        how = "" if healing else "; `casfs scrub --heal-from SOURCE` fetches good copies"
        error(f"{sum(1 for d in report.damaged if not d.healed_from)} damaged blob(s) remain{how}")
        return 5
    return 0


def _peer_sources(repo: Repository) -> list[str]:
    from casfs.catalog.volumes import peer_sources

    return peer_sources(repo.conn)


def _heal(repo: Repository, report: ScrubReport, sources: list[str]) -> None:
    """Heal from each source in turn what the ones before could not; a source that cannot
    be reached is said so for what it was asked."""
    from casfs.errors import CasfsError
    from casfs.replica.peers import blob_fetcher
    from casfs.upkeep import scrub

    if not sources:
        for damage in report.damaged:
            damage.unhealed = "this store has pulled from no other store (no peers to heal from)"
    for source in sources:
        todo = [d for d in report.damaged if not d.healed_from]
        if not todo:
            return
        try:
            with blob_fetcher(source) as fetch:
                scrub.heal(repo, report, source, fetch)
        except (CasfsError, OSError) as e:
            for damage in todo:
                damage.unhealed = f"{source}: unreachable: {e}"


def _progress(report: ScrubReport, roots_left: int) -> None:
    sys.stderr.write(
        f"\r\x1b[Kscrub: {report.roots} root(s) done, {roots_left} to go, "
        f"{format_size(report.bytes)} re-hashed, {len(report.damaged)} damaged"
    )
    sys.stderr.flush()
