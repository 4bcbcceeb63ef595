"""`--bwlimit`'s token bucket over a clock the test moves (no sleeping, no timing)."""

from __future__ import annotations

import random

import pytest

from casfs.errors import UsageError
from casfs.replica.bwlimit import Limit, TokenBucket
from casfs.units import parse_rate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s > 0
        self.now += s


def test_a_burst_passes_then_reads_wait_their_debt() -> None:
    clock = Clock()
    b = TokenBucket(1000, burst=500, clock=clock)
    assert b.take(500) == 0.0
    assert b.take(250) == pytest.approx(0.25)
    clock.now += 0.25
    assert b.take(100) == pytest.approx(0.1)  # (the debt was paid by the wait)
    clock.now += 10  # idle: the bucket refills to its burst, no further
    assert b.take(500) == 0.0
    assert b.take(1) > 0


def test_over_many_reads_the_rate_holds_and_is_reached() -> None:
    clock = Clock()
    limit = Limit(1 << 20, sleep=clock.sleep)
    limit.bucket = TokenBucket(1 << 20, clock=clock)
    start, total, rnd = clock.now, 0, random.Random(7)
    for _ in range(5000):
        n = rnd.choice([37, 4096, 65 << 10, 1 << 20])
        limit(n)
        total += n
        elapsed = clock.now - start
        assert total <= limit.bucket.burst + (1 << 20) * elapsed + 1  # never over the rate
    # Never slower than the rate either: the waits are the debt, not more.
    assert total >= (1 << 20) * (clock.now - start)


@pytest.mark.parametrize(
    ("text", "rate"),
    [("50M", 50 << 20), ("50M/s", 50 << 20), ("800k", 800 << 10), ("1G", 1 << 30), ("4096", 4096)],
)
def test_rates_parse_as_sizes_per_second(text: str, rate: int) -> None:
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["", "fast", "0", "-5M", "5X"])
def test_a_bad_rate_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="invalid rate"):
        parse_rate(text)
