"""Retention: which snapshots of a volume a policy keeps, and removing the others.

The rules are restic's `forget` and zrepl's `last_n`/grid, reduced to three:

  last N     the N newest snapshots
  hourly H   the newest snapshot of each of the H newest hours that have one
  daily D    the same per day

A snapshot kept by any rule stays. Whatever the policy, the newest snapshot stays (the
volume's state, and the base of a replica's next pull), and so does one a volume was
made from. Hours and days are UTC: a store's retention does not move with the
machine's time zone.

Each removed snapshot leaves a bookmark (its number and root, no reference: see
casfs.catalog.volumes.add_bookmark), so that a replica's pull still knows the line the
removed snapshot was on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from casfs.catalog import transaction
from casfs.catalog import volumes as rows
from casfs.errors import UsageError
from casfs.ids import SnapshotNo
from casfs.repo import Repository
from casfs.volumes.info import get_volume
from casfs.volumes.snapshots import drop_snapshot, removal_refusal

HOUR = 3600
DAY = 86400


@dataclass(frozen=True)
class KeepPolicy:
    """How many snapshots each rule keeps (None: the rule is off; all off: `empty`, no
    policy, which a registry record may hold and prune refuses)."""

    last: int | None = None
    hourly: int | None = None
    daily: int | None = None

    def __post_init__(self) -> None:
        for rule, value in self.rules():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UsageError(f"invalid keep-{rule} {value!r}: a whole number >= 1")

    @property
    def empty(self) -> bool:
        """No rule on: `prune` refuses it (it would keep only the newest), as restic does."""
        return all(value is None for _, value in self.rules())

    def rules(self) -> list[tuple[str, int | None]]:
        return [("last", self.last), ("hourly", self.hourly), ("daily", self.daily)]

    def to_dict(self) -> dict[str, int]:
        """The rules that are on: the registry's JSON."""
        return {rule: value for rule, value in self.rules() if value is not None}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> KeepPolicy:
        unknown = set(d) - {"last", "hourly", "daily"}
        if unknown:
            raise UsageError(f"unknown retention rule(s): {', '.join(sorted(unknown))}")
        return KeepPolicy(d.get("last"), d.get("hourly"), d.get("daily"))


def decide(
    snaps: Iterable[tuple[int, float]], policy: KeepPolicy, held: Iterable[int] = ()
) -> dict[int, list[str]]:
    """The snapshots kept, each with why: `snaps` as (number, unix time taken); `held`
    those something else needs. Every snapshot not in the answer goes. Pure."""
    newest_first = sorted(snaps, key=lambda s: s[0], reverse=True)
    kept: dict[int, list[str]] = {}

    def keep(n: int, why: str) -> None:
        kept.setdefault(n, []).append(why)

    if newest_first:
        keep(newest_first[0][0], "newest")
    for n in held:
        if any(n == m for m, _ in newest_first):
            keep(n, "in use")
    for n, _ in newest_first[: policy.last or 0]:
        keep(n, "last")
    for rule, count, width in (("hourly", policy.hourly, HOUR), ("daily", policy.daily, DAY)):
        seen: set[int] = set()
        for n, taken in newest_first:  # (newest first: the first of a period is its newest)
            if len(seen) >= (count or 0):
                break
            period = int(taken // width)
            if period not in seen:
                seen.add(period)
                keep(n, rule)
    return kept


@dataclass(frozen=True)
class Pruned:
    """What a prune did (or would do, dry): for the command's output."""

    volume: str
    kept: dict[int, list[str]]
    removed: list[int]

    def to_json(self) -> dict[str, Any]:
        return {
            "volume": self.volume,
            "kept": [{"n": n, "why": why} for n, why in sorted(self.kept.items())],
            "removed": self.removed,
        }


def prune(repo: Repository, volume: str, policy: KeepPolicy, *, dry_run: bool = False) -> list[int]:
    """Remove the snapshots of `volume` that `policy` does not keep; their numbers."""
    return prune_volume(repo, volume, policy, dry_run=dry_run).removed


def prune_volume(repo: Repository, volume: str, policy: KeepPolicy, *, dry_run: bool = False) -> Pruned:
    """`prune` with what was kept and why. One transaction: the choice is made on the
    rows it removes from (a snapshot taken or cloned meanwhile is seen or waits)."""
    if policy.empty:
        raise UsageError("a retention policy needs at least one of keep-last, keep-hourly, keep-daily")
    get_volume(repo, volume)  # (NotFound, exit 3, for no such volume)
    conn = repo.conn
    with transaction(conn):
        snaps = rows.snapshot_rows(conn, volume)
        held = [s.n for s in snaps if removal_refusal(conn, volume, s.n) is not None]
        kept = decide([(s.n, s.created) for s in snaps], policy, held)
        removed = [int(s.n) for s in snaps if s.n not in kept]
        if not dry_run:
            for n in removed:
                drop_snapshot(conn, volume, SnapshotNo(n))
    return Pruned(volume, kept, removed)
