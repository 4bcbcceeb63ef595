"""Where read/write volumes keep their upper files: STORE/upper/<volume>/, for a block
volume one pair of files per epoch (casfs.vfs.overlay.upper), for a directory volume
one file per changed inode, `i<ino>.<generation>` (casfs.vfs.overlay.files). Here only
the layout: finding, sizing and deleting them."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path


def upper_dir(store: Path, volume: str) -> Path:
    return store / "upper" / volume


def remove_stale(store: Path, volume: str, keep: set[int]) -> None:
    """Delete the volume's upper files of every epoch not in `keep`."""
    folder = upper_dir(store, volume)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        stem, _, _ = name.partition(".")
        if not stem.isdigit() or int(stem) not in keep:
            (folder / name).unlink(missing_ok=True)


def remove_all(store: Path, volume: str) -> None:
    """Delete a volume's upper directory (the volume is gone)."""
    shutil.rmtree(upper_dir(store, volume), ignore_errors=True)


def remove_unknown(store: Path, volumes: set[str]) -> int:
    """Delete the upper directories of volumes not in `volumes` (a crash between a
    volume's delete and its files'); returns how many files went."""
    try:
        names = os.listdir(store / "upper")
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        if name not in volumes:
            removed += len(os.listdir(upper_dir(store, name)))
            remove_all(store, name)
    return removed


def local_bytes(store: Path, volume: str, epochs: Iterable[int]) -> int:
    """Disk space the data written into the volume's upper files takes: a block
    volume's of these epochs (whole clusters: a first write into one fills it), and a
    directory volume's files (allocated, not size; the maps are bookkeeping, as catalog
    rows are)."""
    folder = upper_dir(store, volume)
    names = [f"{epoch}.data" for epoch in epochs]
    with contextlib.suppress(FileNotFoundError):
        names += [n for n in os.listdir(folder) if n.startswith("i")]
    total = 0
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(folder / name).st_blocks * 512
    return total
