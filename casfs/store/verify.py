"""Checking outside content against an expected digest while it is read, in one pass."""

from __future__ import annotations

import hashlib
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

    def _feed(self, data: bytes) -> None:
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
