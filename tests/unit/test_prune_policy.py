"""Retention's choice as a pure function of (number, time taken): restic's rules."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from casfs.errors import UsageError
from casfs.volumes.prune import DAY, HOUR, KeepPolicy, decide

T0 = 1_800_000_000 - 1_800_000_000 % DAY  # a UTC midnight


def kept(snaps: Iterable[tuple[int, float]], policy: KeepPolicy, held: tuple[int, ...] = ()) -> list[int]:
    return sorted(decide(snaps, policy, held))


def test_keep_last_keeps_the_n_newest_by_number() -> None:
    snaps = [(n, T0 + n) for n in range(1, 8)]
    assert kept(snaps, KeepPolicy(last=3)) == [5, 6, 7]


def test_keep_hourly_keeps_the_newest_of_each_of_the_last_hours_that_have_one() -> None:
    # Hours 0 (1, 2), 1 (3), 3 (4, 5), 4 (6): hour 2 has none, so it does not count.
    snaps = [(1, T0 + 10), (2, T0 + 50), (3, T0 + HOUR + 5), (4, T0 + 3 * HOUR), (5, T0 + 3 * HOUR + 9)]
    snaps.append((6, T0 + 4 * HOUR))
    assert kept(snaps, KeepPolicy(hourly=3)) == [3, 5, 6]
    assert kept(snaps, KeepPolicy(hourly=10)) == [2, 3, 5, 6]


def test_keep_daily_buckets_by_utc_day() -> None:
    snaps = [(1, T0 + 1), (2, T0 + DAY - 1), (3, T0 + DAY), (4, T0 + 2 * DAY + HOUR)]
    assert kept(snaps, KeepPolicy(daily=2)) == [3, 4]
    assert kept(snaps, KeepPolicy(daily=3)) == [2, 3, 4]


def test_the_rules_add_up_and_say_why() -> None:
    snaps = [(n, T0 + n * 20 * 60) for n in range(1, 13)]  # every 20 minutes: hours 0 to 4
    why = decide(snaps, KeepPolicy(last=2, hourly=3, daily=1))
    assert sorted(why) == [8, 11, 12]  # hour 4: 12; hour 3: 9-11; hour 2: 6-8
    assert why[12] == ["newest", "last", "hourly", "daily"]
    assert why[11] == ["last", "hourly"]
    assert why[8] == ["hourly"]


def test_the_newest_and_the_held_always_stay() -> None:
    snaps = [(n, T0 + n * DAY) for n in range(1, 6)]
    assert kept(snaps, KeepPolicy(daily=1)) == [5]
    assert kept(snaps, KeepPolicy(last=1), held=(2, 99)) == [2, 5]  # (99: no such snapshot)
    assert kept([], KeepPolicy(last=1)) == []


@pytest.mark.parametrize("bad", [{"last": 0}, {"hourly": -1}, {"daily": True}, {"weekly": 2}])
def test_a_policy_counts_are_whole_numbers_and_its_rules_known(bad: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        KeepPolicy.from_dict(bad)


def test_a_policy_round_trips_through_json() -> None:
    p = KeepPolicy(last=3, daily=7)
    assert p.to_dict() == {"last": 3, "daily": 7}
    assert KeepPolicy.from_dict(p.to_dict()) == p and not p.empty
    assert KeepPolicy.from_dict({}).empty  # (no policy: prune refuses it, CLI-tested)
