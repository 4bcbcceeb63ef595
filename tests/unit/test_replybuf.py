"""Read replies assembled into the daemon's reused buffer: the same bytes as assemble(),
and a buffer still held elsewhere is never written over."""

from __future__ import annotations

import functools
import os

from hypothesis import given
from hypothesis import strategies as st

from casfs.fuse.replybuf import ReplyBuffer
from casfs.store.ids import ZERO_ID, blob_id
from casfs.vfs.api import ReadPiece, assemble, assemble_into

CHUNK = 1 << 12
_BLOBS = {blob_id(b): b for b in (os.urandom(CHUNK), os.urandom(CHUNK // 3))}  # (one short chunk)
_IDS = [*_BLOBS, ZERO_ID]


@st.composite
def pieces(draw: st.DrawFn) -> list[ReadPiece]:
    out = []
    for _ in range(draw(st.integers(0, 6))):
        start = draw(st.integers(0, CHUNK - 1))
        end = draw(st.integers(start + 1, CHUNK))
        kind = draw(st.sampled_from(["blob", "data", "read"]))
        if kind == "blob":
            out.append(ReadPiece(start, end, draw(st.sampled_from(_IDS))))
        else:
            data = draw(st.binary(max_size=CHUNK))  # (shorter than the chunk: zeros follow)
            if kind == "data":
                out.append(ReadPiece(start, end, data=data))
            else:
                out.append(ReadPiece(start, end, read=functools.partial(bytes, data)))
    return out


@given(pieces(), st.integers(0, 3))
def test_assemble_into_writes_what_assemble_returns(ps: list[ReadPiece], slack: int) -> None:
    want = assemble(ps, _BLOBS.__getitem__)
    assert len(want) == sum(p.end - p.start for p in ps)
    out = bytearray(b"\xee" * (len(want) + slack))
    n = assemble_into(ps, _BLOBS.__getitem__, memoryview(out))
    assert n == len(want) and out[:n] == want and out[n:] == b"\xee" * slack


def test_holes_and_short_chunks_read_as_zeros() -> None:
    short = next(b for b in _BLOBS if len(_BLOBS[b]) < CHUNK)
    ps = [ReadPiece(10, 20, ZERO_ID), ReadPiece(0, CHUNK, short), ReadPiece(0, 3, data=b"ab")]
    want = bytes(10) + _BLOBS[short] + bytes(CHUNK - len(_BLOBS[short])) + b"ab\0"
    assert assemble(ps, _BLOBS.__getitem__) == want
    buf = ReplyBuffer()
    assert buf.fill(1 << 20, lambda out: assemble_into(ps, _BLOBS.__getitem__, out)) == want


def _fill(buf: ReplyBuffer, data: bytes, size: int | None = None) -> memoryview:
    def write(out: memoryview) -> int:
        out[: len(data)] = data
        return len(data)

    return buf.fill(len(data) if size is None else size, write)


def test_the_buffer_is_reused_once_let_go() -> None:
    buf = ReplyBuffer()
    first = _fill(buf, b"a" * 100, size=4096)
    assert first == b"a" * 100
    del first  # (as pyfuse3 lets go of a reply once it has written it)
    second = _fill(buf, b"b" * 50)
    third_obj = second.obj
    del second
    third = _fill(buf, b"c" * 4096)
    assert third == b"c" * 4096 and third.obj is third_obj  # one buffer throughout
    del third
    bigger = _fill(buf, b"d" * 8192)  # a bigger request: a bigger buffer
    assert bigger == b"d" * 8192 and bigger.obj is not third_obj


def test_a_reply_still_held_is_not_written_over() -> None:
    buf = ReplyBuffer()
    held = _fill(buf, b"x" * 1000)
    again = _fill(buf, b"y" * 1000)
    assert held == b"x" * 1000 and again == b"y" * 1000 and held.obj is not again.obj
