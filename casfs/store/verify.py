"""Checking outside content against an expected digest while it is read, in one pass."""

from __future__ import annotations

import hashlib
import os
import stat
from typing import BinaryIO

import blake3

from casfs.errors import DigestMismatch, UsageError

ALGORITHMS = ("sha256", "blake3")


def parse_expect(text: str) -> tuple[str, str]:
    """'sha256:HEX' or 'blake3:HEX' -> (algorithm, lowercase hex)."""
    algo, sep, hexdigest = text.partition(":")
    algo = algo.lower()
    hexdigest = hexdigest.lower()
    if not sep or algo not in ALGORITHMS:
        raise UsageError(f"invalid digest {text!r}: expected sha256:HEX or blake3:HEX")
    if len(hexdigest) != 64 or any(c not in "0123456789abcdef" for c in hexdigest):
        raise UsageError(f"invalid digest {text!r}: a {algo} digest is 64 hex digits")
    return algo, hexdigest


class HashingReader:
    """A read-only stream that hashes what passes through (blake3 always, sha256 on
    request), so a source is checked without reading it twice."""

    def __init__(self, raw: BinaryIO, sha256: bool = False) -> None:
        self.raw = raw
        self.b3 = blake3.blake3()
        self.sha = hashlib.sha256() if sha256 else None
        self.bytes_read = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self._feed(data)
        return data

    def reopen_direct(self) -> int | None:
        """A new descriptor reading the same file with O_DIRECT (the disk's DMA straight
        into the caller's buffers: no copy out of the page cache, which cost an import
        as much CPU as hashing), when the source is a regular file not yet read from;
        else None. The caller reads it from offset 0, passes every block to feed(), and
        then skip_to_end()."""
        try:
            fd = self.raw.fileno()
            if self.bytes_read or not stat.S_ISREG(os.fstat(fd).st_mode) or self.raw.tell() != 0:
                return None
            return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
        except (AttributeError, OSError, ValueError):  # (no fd, no /proc, no O_DIRECT here)
            return None

    def feed(self, data: bytes | memoryview) -> None:
        """Hash bytes read past this reader (through reopen_direct's descriptor)."""
        self._feed(data)

    def skip_to_end(self) -> None:
        """After reading through reopen_direct: drain() has nothing left to read."""
        self.raw.seek(0, os.SEEK_END)

    def _feed(self, data: bytes | memoryview) -> None:
        if data:
            self.b3.update(data)
            if self.sha is not None:
                self.sha.update(data)
            self.bytes_read += len(data)

    def drain(self) -> None:
        while self.read(1 << 20):
            pass

    def readable(self) -> bool:
        return True

    def digests(self) -> dict[str, str]:
        out = {"blake3": self.b3.hexdigest()}
        if self.sha is not None:
            out["sha256"] = self.sha.hexdigest()
        return out

    def check(self, expect: tuple[str, str] | None) -> None:
        if expect is None:
            return
        algo, want = expect
        got = self.digests()[algo]
        if got != want:
            raise DigestMismatch(
                f"digest mismatch: expected {algo}:{want}, got {algo}:{got}; nothing was stored"
            )
