"""Appending a pack's bytes with O_DIRECT through aligned buffers (store.packwrite):
the file holds exactly what was appended, whatever the sizes (blobs larger than a
buffer, a blob whose record failed cut off), and a failed write is never forgotten."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from casfs.store.packwrite import BUFFER, DirectAppender, FileAppender, open_direct


def _open(path: Path) -> tuple[int, FileAppender]:
    fd, direct = open_direct(str(path), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    return fd, DirectAppender(fd, reserve=16 * BUFFER) if direct else FileAppender(fd)


def test_the_file_holds_what_was_appended(tmp_path: Path) -> None:
    rnd = random.Random(8)
    sizes = [
        1,
        24,
        4095,
        4096,
        65537,
        BUFFER - 3,
        3 * BUFFER + 5,
        *(rnd.randint(1, 200_000) for _ in range(60)),
    ]
    fd, out = _open(tmp_path / "p")
    want = bytearray()
    try:
        for n in sizes:
            head, body = bytes([n % 2]), rnd.randbytes(n)
            out.append((head, memoryview(body)))
            want += head + body
        before = len(want)
        out.append((b"x" * 5000,))
        out.cut(before)  # (its record failed)
        out.finish()
    finally:
        out.close()
        os.close(fd)
    assert (tmp_path / "p").read_bytes() == want


def test_a_failed_write_fails_every_later_step(tmp_path: Path) -> None:
    fd, out = _open(tmp_path / "p")
    if not isinstance(out, DirectAppender):
        os.close(fd)
        pytest.skip("this file system refuses O_DIRECT")
    wrong = os.open(tmp_path / "p", os.O_RDONLY)
    out.fd = wrong  # (its writes fail: EBADF)
    try:
        assert isinstance(_append_until_it_fails(out), OSError)
        with pytest.raises(OSError):
            out.append((bytes(BUFFER),))
        with pytest.raises(OSError):
            out.finish()
    finally:
        out.close()
        os.close(wrong)
        os.close(fd)


def _append_until_it_fails(out: FileAppender) -> BaseException | None:
    """The error of a buffer's write, raised by a later append that needs a buffer
    (at the latest once as many are being written as an appender lets be)."""
    for _ in range(8):
        try:
            out.append((bytes(BUFFER),))
        except OSError as e:
            return e
    return None
