"""Importers: turn a directory, a tar archive or a raw disk image into blobs in a Batch.

Each returns a Built; the caller commits the batch with a reference on `root`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from casfs.ids import InodeNo
from casfs.store.ids import BlobId


class Readable(Protocol):
    """What an importer reads its source through: read(n) only (a file, a pipe, the
    hashing reader that checks --expect)."""

    def read(self, n: int, /) -> bytes: ...


@dataclass(frozen=True)
class Built:
    root: BlobId  # tree id of a directory image, chunk-map root of a block image
    size: int  # logical bytes: regular files' sizes, each hardlinked file once
    next_ino: InodeNo  # first inode number not used by the image
