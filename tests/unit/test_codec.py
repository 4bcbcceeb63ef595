"""The blob codec: what is stored raw (without compressing all of it), what is
compressed, and that every form decodes back to its plaintext."""

from __future__ import annotations

import os
import random

import pytest
import zstandard

from casfs.errors import Corruption
from casfs.store import codec

CHUNK = 64 << 10


def text(n: int, seed: int = 1) -> bytes:
    rnd = random.Random(seed)
    words = [bytes(rnd.choices(b"abcdefghijklmnopqrstuvwxyz", k=rnd.randint(2, 9))) for _ in range(500)]
    return b" ".join(rnd.choices(words, k=n // 4))[:n].ljust(n, b".")


def test_random_chunk_is_stored_raw_as_itself() -> None:
    plain = os.urandom(CHUNK)
    head, payload = codec.encode_parts(plain)
    assert head == bytes((codec.RAW,)) and payload is plain  # (no copy of it)
    assert codec.encode(plain) == head + plain
    assert codec.decode(codec.encode(plain)) == plain


def test_text_is_compressed() -> None:
    plain = text(CHUNK)
    stored = codec.encode(plain)
    assert stored[0] == codec.ZSTD and len(stored) < len(plain) * 3 // 4
    assert codec.decode(stored) == plain


@pytest.mark.parametrize("where", [0, CHUNK // 2])
def test_one_compressible_sample_sends_the_chunk_to_zstd(where: int) -> None:
    """Random bytes but for text where one of the samples is: the whole chunk goes
    through zstd (stored compressed if that is smaller, raw otherwise)."""
    plain = bytearray(os.urandom(CHUNK))
    plain[where : where + 8192] = text(8192)
    assert not codec._incompressible(codec._compressor(), memoryview(plain))
    assert codec._incompressible(codec._compressor(), memoryview(os.urandom(CHUNK)))
    assert codec.decode(codec.encode(bytes(plain))) == plain


@pytest.mark.parametrize("size", [0, 1, 4096, 32767, 32768, CHUNK + 3])
def test_every_size_round_trips(size: int) -> None:
    for plain in (os.urandom(size), text(size), bytes(size)):
        stored = codec.encode(plain)
        assert len(stored) <= len(plain) + 1
        assert codec.decode(stored) == plain


def test_decode_refuses_trailing_bytes_and_unknown_codecs() -> None:
    stored = codec.encode(text(CHUNK))
    with pytest.raises(Corruption):
        codec.decode(stored + b"x")
    with pytest.raises(Corruption):
        codec.decode(bytes((7,)) + stored[1:])
    with pytest.raises(Corruption):
        codec.decode(b"")


def test_decode_many_decodes_whole_frames_together_and_leaves_the_rest_to_decode() -> None:
    """A span's zstd blobs are decoded by one call (their plaintexts, as decode() gives
    them); a raw blob, and a frame that is not exactly one whole frame within the size
    limit, get None: decode() alone says what is wrong with it."""
    plains = [text(CHUNK, seed=n) for n in range(4)]
    good = [codec.encode(p) for p in plains]
    assert all(g[0] == codec.ZSTD for g in good)
    undeclared = bytes((codec.ZSTD,)) + zstandard.ZstdCompressor(write_content_size=False).compress(plains[0])
    checksummed = bytes((codec.ZSTD,)) + zstandard.ZstdCompressor(write_checksum=True).compress(plains[1])
    odd = {
        "raw": codec.encode(os.urandom(CHUNK)),
        "trailing": good[0] + b"x",
        "truncated": good[1][:-5],
        "undeclared": undeclared,
        "empty": b"",
    }
    stored = [*good[:2], *odd.values(), *good[2:], checksummed]
    got = codec.decode_many([memoryview(s) for s in stored])
    assert got[:2] == plains[:2] and got[-3:] == [*plains[2:], plains[1]]
    assert got[2 : 2 + len(odd)] == [None] * len(odd)
    for blob in odd.values():
        if blob[:1] == bytes((codec.ZSTD,)) and blob is not undeclared:
            with pytest.raises(Corruption):
                codec.decode(blob)
    # zstd refusing a frame whose headers look whole (its declared size is not what its
    # blocks hold): every blob is left to decode()
    bad = good[3][:6] + bytes((good[3][6] ^ 0x01,)) + good[3][7:]
    assert codec._whole_frame(memoryview(bad)[1:])  # (so both frames reach zstd's batch)
    assert codec.decode_many([memoryview(good[0]), memoryview(bad)]) == [None, None]
    with pytest.raises(Corruption):
        codec.decode(bad)
