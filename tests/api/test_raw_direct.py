"""A raw image is read with O_DIRECT into reused buffers when it is a regular file, and
with read() otherwise: both give the same image, byte for byte, whatever its size (short
last blocks, sizes off any alignment), and the same digest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from casfs.exporters import export_raw
from casfs.images import import_image
from casfs.importers import raw
from casfs.repo import Repository
from casfs.store.ids import BlobId
from casfs.store.verify import HashingReader

BLOCK = raw._BLOCK


def image(size: int) -> bytes:
    third = size // 3
    return os.urandom(third) + bytes(third) + b"text " * ((size - 2 * third) // 5 + 1)


def root(repo: Repository, name: str) -> BlobId:
    return BlobId(repo.conn.execute("SELECT root FROM images WHERE name = ?", (name,)).fetchone()[0])


@pytest.mark.parametrize("size", [0, 1, 4097, BLOCK - 1, BLOCK, (raw._INFLIGHT + 3) * BLOCK + 65536 + 7])
def test_direct_and_buffered_reads_store_the_same_image(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    data = image(size)
    (tmp_path / "disk.img").write_bytes(data)
    opened: list[int | None] = []
    reopen = HashingReader.reopen_direct

    def spy(self: HashingReader) -> int | None:
        opened.append(reopen(self))
        return opened[-1]

    monkeypatch.setattr(HashingReader, "reopen_direct", spy)
    import_image(repo, "direct", tmp_path / "disk.img")
    assert opened and opened[0] is not None  # (the direct path was taken)
    monkeypatch.setattr(HashingReader, "reopen_direct", lambda self: None)
    import_image(repo, "buffered", tmp_path / "disk.img")
    assert root(repo, "direct") == root(repo, "buffered")
    export_raw(repo.get, root(repo, "direct"), tmp_path / "out.raw")
    assert (tmp_path / "out.raw").read_bytes() == data


def test_a_failing_first_direct_read_falls_back(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = image(3 * BLOCK + 5)
    (tmp_path / "disk.img").write_bytes(data)
    real = os.preadv

    def refuse(fd: int, buffers: list[object], offset: int) -> int:
        raise OSError(22, "refused")

    monkeypatch.setattr(os, "preadv", refuse)
    import_image(repo, "fallback", tmp_path / "disk.img")
    monkeypatch.setattr(os, "preadv", real)
    export_raw(repo.get, root(repo, "fallback"), tmp_path / "out.raw")
    assert (tmp_path / "out.raw").read_bytes() == data
