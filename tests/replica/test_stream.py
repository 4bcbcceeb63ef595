"""`casfs snapshot send | casfs snapshot receive` between two stores: round trips,
incremental streams, and streams that must be refused with nothing of them visible."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import blake3
import pytest

from casfs import kinds, volumes
from casfs.kinds import BlobKind
from casfs.repo import Repository
from tests.api.test_roundtrip import make_tree
from tests.helpers.trees import compare
from tests.replica.helpers import (
    MiB,
    block_volume,
    cli,
    exported,
    new_data_bytes,
    random_writes,
    receive,
    root_of,
    send,
    visible,
    write_block,
)


def test_block_round_trip_keeps_numbers_roots_and_bytes(two: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two
    block_volume(a, tmp_path, "vm1", 8 * MiB, os.urandom(3 * MiB))
    write_block(a, "vm1", [(5 * MiB, os.urandom(MiB))])  # vm1@1
    n = write_block(a, "vm1", [(100, b"x" * 5000)])  # vm1@2
    p = receive(b, send(a, f"vm1@{n}"), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert (doc["n"], doc["plan"]) == (n, "new")
    assert root_of(b, f"vm1@{n}") == root_of(a, f"vm1@{n}")
    assert exported(a, f"vm1@{n}", tmp_path / "a.img") == exported(b, f"vm1@{n}", tmp_path / "b.img")
    info = json.loads(cli(b, "volume", "info", "vm1", "--json").stdout)
    assert info["snapshots"] == [n] and info["base"] == root_of(a, f"vm1@{n}")


def test_dir_round_trip_keeps_hardlinks_xattrs_and_holes(two: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two
    make_tree(tmp_path / "src")
    assert cli(a, "image", "import", "tree", tmp_path / "src").returncode == 0
    assert cli(a, "volume", "create", "ct", "--from", "tree").returncode == 0
    assert cli(a, "snapshot", "create", "ct").returncode == 0
    assert receive(b, send(a, "ct@1")).returncode == 0
    exported(a, "ct@1", tmp_path / "out-a")
    exported(b, "ct@1", tmp_path / "out-b")
    assert compare(tmp_path / "out-a", tmp_path / "out-b") == []
    sparse = (tmp_path / "out-b" / "sparse").stat()
    assert sparse.st_blocks * 512 < sparse.st_size // 4  # still sparse


def test_incremental_moves_only_the_change(two: tuple[Path, Path], tmp_path: Path) -> None:
    """A 10 MiB change to a 1 GiB volume: the stream is at most 1.2x the changed data's
    stored bytes (the map pages it rewrote are the rest)."""
    a, b = two
    size = 1 << 30
    block_volume(a, tmp_path, "big", size, os.urandom(16 * MiB))
    one = write_block(a, "big", [(512 * MiB, os.urandom(MiB))])
    two_ = write_block(a, "big", random_writes(7, size, 10 * MiB))
    assert receive(b, send(a, f"big@{one}")).returncode == 0
    stream = send(a, f"big@{two_}", since=f"big@{one}")
    changed = new_data_bytes(a, f"big@{two_}", f"big@{one}", BlobKind.MAP_ROOT)
    assert changed >= 10 * MiB
    assert len(stream) <= 1.2 * changed, (len(stream), changed)
    p = receive(b, stream)
    assert p.returncode == 0, p.stderr
    assert root_of(b, f"big@{two_}") == root_of(a, f"big@{two_}")
    assert exported(a, f"big@{two_}", tmp_path / "a.img") == exported(b, f"big@{two_}", tmp_path / "b.img")


@pytest.fixture
def stream(two: tuple[Path, Path], tmp_path: Path) -> bytes:
    a, _ = two
    block_volume(a, tmp_path, "vm1", 4 * MiB, os.urandom(2 * MiB))
    write_block(a, "vm1", [(0, b"y" * 70000)])
    return send(a, "vm1@1")


def refused(b: Path, data: bytes, code: int, *args: str) -> str:
    before = visible(b)
    p = receive(b, data, *args)
    assert p.returncode == code, (p.returncode, p.stderr)
    assert visible(b) == before
    return p.stderr.decode()


def test_a_damaged_blob_is_refused_with_exit_5(two: tuple[Path, Path], stream: bytes) -> None:
    bad = bytearray(stream)
    bad[len(bad) // 2] ^= 0x40
    assert "error" in refused(two[1], bytes(bad), 5)
    assert receive(two[1], stream).returncode == 0  # the next try, intact, lands


@pytest.mark.parametrize("cut", [5, 40, 1000, -5000, -40, -1])
def test_a_truncated_stream_is_refused(two: tuple[Path, Path], stream: bytes, cut: int) -> None:
    message = refused(two[1], stream[:cut], 5)
    assert "truncated" in message


def test_a_changed_trailer_is_refused(two: tuple[Path, Path], stream: bytes) -> None:
    bad = bytearray(stream)
    bad[-1] ^= 1
    assert "hash mismatch" in refused(two[1], bytes(bad), 5)
    assert "after its trailer" in refused(two[1], stream + b"x", 5)
    assert "not a casfs snapshot stream" in refused(two[1], b"hello" * 10, 5)


def _places(stream: bytes) -> dict[str, int]:
    """Offsets of one byte in each part of a stream (replica.stream's format 1)."""
    header = 18 + int.from_bytes(stream[14:18], "little")
    volume = stream.index(b'"vm1"') + 1
    return {
        "format": 12,
        "format, high byte": 13,
        "header length": 15,
        "header, volume name": volume + 1,
        "header, root id": stream.index(b'"root"', 18) + 10,
        "record tag": header,
        "blob id": header + 5,
        "blob kind": header + 33,
        "blob length": header + 34,
        "blob bytes": header + 60,
        "last blob": len(stream) - 100,
        "trailer counts": len(stream) - 40,
        "trailer hash": len(stream) - 1,
    }


PARTS = ["format", "format, high byte", "header length", "header, volume name", "header, root id"]
PARTS += ["record tag", "blob id", "blob kind", "blob length", "blob bytes", "last blob"]
PARTS += ["trailer counts", "trailer hash"]


@pytest.mark.parametrize("part", PARTS)
def test_a_byte_flipped_anywhere_exits_5(two: tuple[Path, Path], stream: bytes, part: str) -> None:
    """Issue 32: also where the header decides a refusal (a format byte, a name): the
    rest of the stream is read and its hash checked, so the answer is exit 5."""
    for flip in (0x41, 0x01):  # (0x41 makes the name invalid: "v,1")
        bad = bytearray(stream)
        bad[_places(stream)[part]] ^= flip
        assert "error" in refused(two[1], bytes(bad), 5)


def test_an_intact_stream_of_another_format_is_unsupported(two: tuple[Path, Path], stream: bytes) -> None:
    """A newer casfs's stream, whole (its hash matches), is not called damaged: exit 1."""
    other = bytearray(stream[:-32])
    other[12:14] = (2).to_bytes(2, "little")
    other += blake3.blake3(bytes(other)).digest()
    assert "stream format 2; this casfs reads format 1" in refused(two[1], bytes(other), 1)
    # a damaged replay of a snapshot held already is refused too (it read as a no-op)
    assert receive(two[1], stream).returncode == 0
    bad = bytearray(stream)
    bad[len(bad) // 2] ^= 0x40
    assert "hash mismatch" in refused(two[1], bytes(bad), 5)


def test_a_replayed_stream_does_nothing(two: tuple[Path, Path], stream: bytes) -> None:
    b = two[1]
    assert receive(b, stream).returncode == 0
    before = visible(b)
    p = receive(b, stream)
    assert p.returncode == 0 and b"already have vm1@1" in p.stdout
    assert visible(b) == before


def test_an_incremental_stream_needs_its_base(two: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two
    block_volume(a, tmp_path, "vm1", 4 * MiB, os.urandom(MiB))
    write_block(a, "vm1", [(0, b"1" * 4096)])
    write_block(a, "vm1", [(0, b"2" * 4096)])
    incremental = send(a, "vm1@2", since="vm1@1")
    assert "does not hold" in refused(b, incremental, 3)
    # b holds another vm1@1 (its own line): refused as a conflict, not merged
    (tmp_path / "other").mkdir()
    block_volume(b, tmp_path / "other", "vm1", 4 * MiB, os.urandom(MiB))
    write_block(b, "vm1", [(0, b"3" * 4096)])
    assert "incremental from vm1@1" in refused(b, incremental, 4)
    assert "diverged" in refused(b, send(a, "vm1@1"), 4)
    assert receive(b, send(a, "vm1@1"), "--as", "vm1-a").returncode == 0


def test_a_volume_over_the_size_limit_is_refused_before_it_lands(
    two: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 16 TiB block volume an older casfs made (ext4 cannot hold its upper file): a
    stream of it is refused as a read/write replica with a clear error, and nothing lands."""
    a, b = two
    with contextlib.closing(Repository.open(a)) as repo:
        with monkeypatch.context() as older:
            older.setattr(kinds, "MAX_BLOCK_SIZE", 16 << 40)
            volumes.create_volume(repo, "big", volumes.Source(blank_block=16 << 40))
        volumes.create_snapshot(repo, "big")
    p = receive(b, send(a, "big@1"))
    assert p.returncode == 2 and b"at most 16 TiB less 1 MiB" in p.stderr, p.stderr
    assert json.loads(cli(b, "volume", "ls", "--json").stdout) == []
