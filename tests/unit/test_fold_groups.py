"""A fold's group of chunks stored at once (vfs.rw.jobs.puts._put_group): spans of the
upper file read into the worker's reused buffer (consecutive ones together), chunks
given as bytes or read by a callable, in parts of at most the buffer; each id is its
own chunk's, in order, and every chunk reads back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from casfs.repo import Repository
from casfs.store.ids import ZERO_ID, blob_id
from casfs.vfs.overlay.upper import BLOCK, Upper
from casfs.vfs.rw.jobs import puts as fold

CS = 4 * BLOCK


def test_a_group_stores_each_chunk_under_its_own_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fold, "_BUFFER", 3 * CS)  # (parts of three chunks: splits mid-run)
    monkeypatch.setattr(fold, "_local", type(fold._local)())  # (no buffer of another size)
    repo = Repository.init(tmp_path / "store")
    upper = Upper.create(tmp_path / "store", "v", 64 * CS)
    disk = os.urandom(40 * CS)
    upper.pwrite(0, disk)
    same = disk[5 * CS : 6 * CS]
    items: list[tuple[int, fold.Data]] = [
        *((n, fold.Span(upper, n * CS, CS)) for n in range(5)),  # a run longer than a part
        (5, same),  # bytes
        (6, fold.Span(upper, 9 * CS, CS)),  # a gap before it
        (7, lambda: disk[20 * CS : 21 * CS]),  # read by a callable
        (8, fold.Span(upper, 10 * CS, 5 * CS)),  # larger than the buffer
        (9, fold.Span(upper, 60 * CS, CS)),  # never written: zeros, a hole
        (10, fold.Span(upper, 5 * CS, CS)),  # the same bytes as 5
    ]
    want = [
        *(disk[n * CS : (n + 1) * CS] for n in range(5)),
        same,
        disk[9 * CS : 10 * CS],
        disk[20 * CS : 21 * CS],
        disk[10 * CS : 15 * CS],
    ]
    with repo.batch() as batch:
        got = fold._put_group(batch, items)
        batch.commit()
    assert [k for k, _ in got] == list(range(11))
    ids = [bid for _, bid in got]
    assert ids == [*(blob_id(w) for w in want), ZERO_ID, blob_id(same)]
    assert all(repo.get(bid) == w for bid, w in zip(ids, want, strict=False))
    repo.close()
