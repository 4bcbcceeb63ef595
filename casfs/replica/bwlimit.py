"""`--bwlimit`: a token bucket on the reading side of a pull's connection.

The receiver reads at most RATE bytes per second (over any span, plus one burst): when
it reads less, the source's writes wait in the pipe and the network, so the rate holds
end to end without the source knowing. Tokens accrue at RATE up to BURST; a read takes
as many as it read, going into debt if it must, and the reader sleeps the debt off.
The bucket is a pure object over an injected clock (tests drive it without sleeping).
"""

from __future__ import annotations

import time
from collections.abc import Callable

MIN_BURST = 256 << 10  # (a blob record, up to a chunk, never waits on its own size alone)


class TokenBucket:
    def __init__(
        self, rate: int, burst: int | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate < 1:
            raise ValueError("a rate is at least 1 byte per second")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(MIN_BURST, rate // 10))
        self.clock = clock
        self.tokens = self.burst
        self.at = clock()

    def take(self, n: int) -> float:
        """Take `n` bytes' tokens; the seconds to wait before going on (0: none)."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class Limit:
    """What a Meter calls after each read: the bucket's wait, slept."""

    def __init__(self, rate: int, sleep: Callable[[float], None] = time.sleep) -> None:
        self.bucket = TokenBucket(rate)
        self.sleep = sleep

    def __call__(self, n: int) -> None:
        wait = self.bucket.take(n)
        if wait > 0:
            self.sleep(wait)
