"""Blobs a read found damaged, remembered across restarts as empty files
STORE/damaged/<id>: a writer storing the same content then stores it again (healing
it) instead of deduplicating against it. The part of the BlobStore protocol that the
file store and the S3 store (whose catalog and cache are local too) share."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from casfs.store.ids import ID_SIZE, BlobId


class DamagedMarks:
    """mark_damaged / damaged / clear_damaged over `damaged_dir` (set by the store)."""

    damaged_dir: Path

    def mark_damaged(self, bid: BlobId) -> None:
        try:
            self.damaged_dir.mkdir(exist_ok=True)
            (self.damaged_dir / bid.hex()).touch()
        except OSError as e:
            logging.getLogger(__name__).warning("cannot record damaged blob %s: %s", bid.hex(), e)

    def damaged(self) -> set[BlobId]:
        try:
            names = os.listdir(self.damaged_dir)
        except FileNotFoundError:
            return set()
        return {BlobId(bytes.fromhex(n)) for n in names if len(n) == 2 * ID_SIZE}

    def clear_damaged(self, bid: BlobId) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.damaged_dir / bid.hex()).unlink()
