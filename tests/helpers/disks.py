"""Writes to a block volume's disk that a test can check it against."""

from __future__ import annotations

import os
import random
from pathlib import Path


def write_spots(path: Path, ref: bytearray, seed: int) -> None:
    """20 writes of random sizes and alignments into the disk at `path` (as big as
    `ref`), then fdatasync; `ref` follows them."""
    rnd = random.Random(seed)
    fd = os.open(path, os.O_RDWR)
    try:
        for _ in range(20):
            length = rnd.choice([1, 4096, 65536 + 3, 200_000])
            offset = rnd.randrange(0, len(ref) - length)
            data = rnd.randbytes(length)
            assert os.pwrite(fd, data, offset) == length
            ref[offset : offset + length] = data
        os.fdatasync(fd)
    finally:
        os.close(fd)
