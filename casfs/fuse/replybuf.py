"""One reused buffer for the bytes of read replies.

A read reply assembled into fresh memory (b"".join) faulted in every page of it, 256
page faults for each 1 MiB request, and glibc handed the pages back between requests;
an image read warm through the daemon's cache spent most of the handler's time there.
Replies are assembled into this buffer instead, whose pages stay mapped.

Reuse is safe because pyfuse3 (3.5.0, and the fastwait module pins that version) writes
the reply to /dev/fuse in the same step as the handler returns: no other task runs
between `return` and the write, so the next handler finds the buffer free. (casfs's
build of pyfuse3 makes that write without the GIL: other threads run meanwhile, but
only the trio thread, which is in the write, touches this buffer.) Should a
pyfuse3 ever keep the reply longer, the buffer is seen to be still referenced and the
next reply gets a new one: the check is a reference count, not an assumption.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

# sys.getrefcount of the last reply when only this holder has it (its attribute, the
# call's argument).
_UNHELD = 2


class ReplyBuffer:
    def __init__(self) -> None:
        self._buf = bytearray()
        self._last: memoryview | None = None

    def fill(self, size: int, write: Callable[[memoryview], int]) -> memoryview:
        """A view of the first write(buffer of `size` bytes) bytes, valid until the next
        fill (the caller replies with it straight away)."""
        if len(self._buf) < size or (self._last is not None and sys.getrefcount(self._last) > _UNHELD):
            self._buf = bytearray(size)  # (the old one, if held, lives on with its holder)
        whole = memoryview(self._buf)
        self._last = whole[: write(whole[:size])]
        return self._last
