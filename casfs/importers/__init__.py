"""Importers: turn a directory, a tar archive or a raw disk image into blobs in a Batch.

Each returns a Built; the caller commits the batch with a reference on `root`.
"""

from __future__ import annotations

from dataclasses import dataclass

from casfs.ids import InodeNo
from casfs.store.ids import BlobId


@dataclass(frozen=True)
class Built:
    root: BlobId  # tree id of a directory image, chunk-map root of a block image
    size: int  # logical bytes: regular files' sizes, each hardlinked file once
    next_ino: InodeNo  # first inode number not used by the image
