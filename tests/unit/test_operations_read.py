"""FUSE reads of a block volume without a mount (Operations.read in-process): a block of
the upper file, the unwritten blocks of a cluster a write filled, a hole of the base
(answered from the shared zeros), a base chunk, and reads across the end, each equal
to a plain reference."""

from __future__ import annotations

import os
import random
from pathlib import Path

import trio

from casfs import images, volumes
from casfs.fuse.inodes import InodeTable
from casfs.fuse.operations import MountOptions, Operations
from casfs.ids import ROOT_INO
from casfs.repo import Repository
from casfs.vfs.api import ZEROS
from casfs.vfs.chunks import ChunkCache
from casfs.vfs.overlay.upper import BLOCK, CLUSTER
from casfs.vfs.volume import open_volume


def test_reads_of_upper_blocks_filled_clusters_holes_and_the_end(
    store: Path, repo: Repository, tmp_path: Path
) -> None:
    size = 40 * CLUSTER + 5 * BLOCK + 100  # (not a multiple of 4 KiB)
    base = bytearray(random.Random(3).randbytes(size))
    base[20 * CLUSTER : 24 * CLUSTER] = bytes(4 * CLUSTER)  # holes in the base
    (tmp_path / "disk.img").write_bytes(base)
    images.import_image(repo, "disk", tmp_path / "disk.img")
    volumes.create_volume(repo, "vm", volumes.Source(image="disk"))
    v = open_volume(repo, "vm")
    ref = bytearray(base)
    at = 3 * CLUSTER + 2 * BLOCK  # a block in an empty cluster: the write fills it
    for offset, data in ((at, b"U" * BLOCK), (21 * CLUSTER + 100, b"P" * 50)):
        v.write_sync(ROOT_INO, offset, data)
        ref[offset : offset + len(data)] = data
    no_control = None  # (no control plane: reads never ask it)
    options = MountOptions("/nonexistent", str(store))
    ops = Operations(InodeTable(v), ChunkCache(repo.get), no_control, options, lambda _: None)  # type: ignore[arg-type]
    cases = {
        "an upper block": (at, BLOCK),
        "a filled cluster's unwritten block (from below)": (at + BLOCK, BLOCK),
        "a hole of the base": (22 * CLUSTER + BLOCK, BLOCK),
        "a partly written hole of the base": (21 * CLUSTER, BLOCK),
        "a base chunk": (0, BLOCK),
        "across the end": (size - 100, BLOCK),
        "across the end, unaligned": (size - 100 - BLOCK // 2, BLOCK),
    }

    async def read_all() -> dict[str, bytes]:
        fi = await ops.open(ROOT_INO, os.O_RDONLY, None)  # type: ignore[arg-type]
        return {what: bytes(await ops.read(fi.fh, off, n)) for what, (off, n) in cases.items()}

    got = trio.run(read_all)
    for what, (off, n) in cases.items():
        assert got[what] == bytes(ref[off : off + n]), what
    assert bytes(ZEROS) == bytes(len(ZEROS)) and ZEROS.readonly
    v.close()
