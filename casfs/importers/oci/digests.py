"""Content digests as OCI writes them (`sha256:HEX`, `sha512:HEX`): parsed strictly
(a digest names a file in a layout, so it must not be able to name anything else),
computed over streams, compared."""

from __future__ import annotations

import hashlib
import re
from typing import BinaryIO

from casfs.errors import DigestMismatch, UsageError
from casfs.importers import Readable

_FORMS = {"sha256": re.compile(r"[0-9a-f]{64}"), "sha512": re.compile(r"[0-9a-f]{128}")}
_READ = 1 << 20


def parse_digest(text: object, what: str) -> tuple[str, str]:
    """(algorithm, hex) of a digest an image names, or UsageError."""
    if isinstance(text, str):
        algo, _, hexdigest = text.partition(":")
        form = _FORMS.get(algo)
        if form is not None and form.fullmatch(hexdigest):
            return algo, hexdigest
    raise UsageError(f"the image is invalid: {what} has an unsupported or malformed digest {text!r}")


class Hasher:
    """Reads through, hashing what passes (a layer blob, or its decompressed tar)."""

    def __init__(self, src: Readable, algo: str = "sha256") -> None:
        self.src = src
        self.hash = hashlib.new(algo)
        self.size = 0

    def read(self, n: int, /) -> bytes:
        data = self.src.read(n)
        self.hash.update(data)
        self.size += len(data)
        return data

    def digest(self) -> str:
        return f"{self.hash.name}:{self.hash.hexdigest()}"


def digest_of(data: bytes, algo: str = "sha256") -> str:
    return f"{algo}:{hashlib.new(algo, data).hexdigest()}"


def check_stream(f: BinaryIO, digest: str, size: int | None, what: str) -> None:
    """Hash `f` to its end; DigestMismatch unless it has `digest` (and `size`, if given)."""
    algo, _ = parse_digest(digest, what)
    h = Hasher(f, algo)
    while h.read(_READ):
        pass
    check(h.digest(), digest, what)
    if size is not None and h.size != size:
        raise DigestMismatch(f"{what} is {h.size} bytes, its descriptor says {size}; nothing was stored")


def check(got: str, want: str, what: str) -> None:
    if got != want:
        raise DigestMismatch(f"digest mismatch: {what} should be {want}, is {got}; nothing was stored")
