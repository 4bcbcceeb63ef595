"""The read path's one policy: where the chunk cache (casfs.vfs.chunks) reads a miss
of the trio thread, and when it reads ahead. Pure state and decisions, no I/O.

Where a miss is read. A miss costs far less read where it is asked than handed to a
worker and back (two thread wake-ups and the GIL passed back and forth at each of the
read's syscalls: about 160 us of CPU on 2 cores around a read and check of a 64 KiB
chunk that itself costs about 100), so a small miss (one or two chunks) is read on the
trio thread:

  1. nowait   first without waiting (get_nowait, an RWF_NOWAIT read: a blob wholly in
              the page cache is read; for a local store a blob that is not has its
              disk read started, and the pack around it asked for: store.around).
              After _INLINE_GIVE_UP cold tries in a row from a remote store (each try
              wasted), the next _INLINE_BACKOFF requests do not try.
  2. here     what that did not read, by a plain blocking read, as long as such reads
              stay fast: from a local store when no other request waits (idle) and no
              miss is in the workers, or when nowait was not tried or read it (a blob
              in the page cache costs less read here than the hand-off: warm reads
              stay here); from a remote one (a network round trip per miss) only when
              no other request waits. _BLOCKING_SLOW_RUN slow reads in a row pause
              them for _BLOCKING_PAUSE_S.
  3. workers  the rest: the cache's own worker threads, PREFETCH_RUN chunks each. From
              a local store that includes a small miss nowait found out of the page
              cache while other requests wait (hand_off): several disk reads are then
              in flight at once and the other core decodes and hashes, where a blocking
              read here made every queued request wait for each disk read in turn
              (docs/measurements/2026-12-02-cold-misses.md; the hand-off of every miss,
              warm ones too, cost more than it freed: 2026-11-27-read-path.md).

Read-ahead: once a stream (a file of a view) reads sequentially (_SEQUENTIAL_AFTER
reads in a row, each within _SEQ_SLACK of where the last ended: the kernel's own
read-ahead sends several requests at once and they may arrive out of order), the
window beyond it is kept loading, topped up in halves.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

# Misses served on the trio thread: at most this many chunks per request.
_INLINE_MAX = 2
_INLINE_GIVE_UP = 8
_INLINE_BACKOFF = 256
# Not one slow read: on a disk shared with other work, a cold read now and then takes
# longer, and pausing for it sent the next 10 s of misses to workers.
_BLOCKING_SLOW_S = 0.05
_BLOCKING_SLOW_RUN = 3
_BLOCKING_PAUSE_S = 10.0
# Chunks per worker call for misses (a 1 MiB request reads 16 in parallel).
PREFETCH_RUN = 4
_SEQUENTIAL_AFTER = 2
_SEQ_SLACK = 1 << 20
_MAX_STREAMS = 1024

# True when no request waits to be read (the daemon polls its FUSE device).
Idle = Callable[[], bool]


@dataclass
class _Stream:
    next_offset: int  # where the last read ended (the furthest end seen)
    ahead: int  # read-ahead has been issued up to here
    run: int = 0  # sequential reads in a row


class ReadPolicy:
    def __init__(self, local: bool, nowait: bool) -> None:
        self.local = local  # the store's blobs are local files (not a network away)
        self._nowait = nowait  # the store can read without waiting (get_nowait)
        # Set by the daemon once its FUSE session exists; None: never a blocking read here.
        self.idle: Idle | None = None
        self._cold_run = 0  # nowait tries that found the blob out of the page cache, in a row
        self._skip_nowait = 0
        self._block_after = 0.0  # (time.monotonic) no blocking read here before this
        self._slow_run = 0  # blocking reads in a row slower than _BLOCKING_SLOW_S
        self._streams: OrderedDict[Hashable, _Stream] = OrderedDict()

    @staticmethod
    def small(n: int) -> bool:
        """Whether a miss of n chunks may be read on the trio thread at all."""
        return 0 < n <= _INLINE_MAX

    def try_nowait(self) -> bool:
        if not self._nowait:
            return False
        if self._skip_nowait:
            self._skip_nowait -= 1
            return False
        return True

    def nowait_tried(self, hit: bool) -> None:
        if hit:
            self._cold_run = 0
            return
        self._cold_run += 1
        if self._cold_run >= _INLINE_GIVE_UP and not self.local:
            self._cold_run, self._skip_nowait = 0, _INLINE_BACKOFF

    def may_block(self, waiting: int) -> bool:
        """Whether a small miss may be read by a blocking read here, `waiting` fetches
        being in workers."""
        if self.idle is None or time.monotonic() < self._block_after:
            return False
        return self.local or (waiting == 0 and self.idle())

    def hand_off(self, waiting: int) -> bool:
        """Whether a small miss from a local store that nowait found out of the page
        cache goes to the workers instead of a blocking read here: when other requests
        wait (queued in the kernel, or `waiting` fetches in workers), so that their disk
        reads overlap. (A remote store's may_block already asks for idle.)"""
        if not self.local or self.idle is None:
            return False
        return waiting > 0 or not self.idle()

    def blocked(self, seconds: float) -> None:
        """A blocking read here took `seconds`."""
        self._slow_run = self._slow_run + 1 if seconds > _BLOCKING_SLOW_S else 0
        if self._slow_run >= _BLOCKING_SLOW_RUN:
            self._slow_run, self._block_after = 0, time.monotonic() + _BLOCKING_PAUSE_S

    @staticmethod
    def worker_runs(n: int) -> range:
        """Where a miss of n chunks read in workers is cut into calls."""
        return range(0, n, PREFETCH_RUN)

    # -- read-ahead --------------------------------------------------------------

    def read_ahead(self, key: Hashable, offset: int, size: int, window: int) -> tuple[int, int] | None:
        """Note a read of [offset, offset+size) by stream `key`: the bytes [start, stop)
        to start loading now, or None."""
        end = offset + size
        st = self._streams.get(key)
        if st is None:
            self._streams[key] = _Stream(end, end)
            if len(self._streams) > _MAX_STREAMS:
                self._streams.popitem(last=False)
            return None
        self._streams.move_to_end(key)
        if abs(offset - st.next_offset) > _SEQ_SLACK:  # (a random reader's every read: no new _Stream)
            st.next_offset = st.ahead = end
            st.run = 0
            return None
        st.run += 1
        st.next_offset = max(st.next_offset, end)
        if st.run < _SEQUENTIAL_AFTER:
            return None
        start = max(st.ahead, st.next_offset)
        # Top the window up in halves: planning per request would cost more than reading.
        if start - st.next_offset >= window // 2:
            return None
        st.ahead = st.next_offset + window
        return start, st.ahead

    def forget_stream(self, key: Hashable) -> None:
        self._streams.pop(key, None)
