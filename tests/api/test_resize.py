"""Resizing a block volume is an explicit CLI operation (a write never resizes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from casfs import kinds, volumes
from casfs.repo import Repository
from casfs.vfs.api import ROOT_INO, assemble
from casfs.vfs.volume import open_volume
from tests.helpers.cli import casfs


def contents(repo: Repository, name: str) -> bytes:
    v = open_volume(repo, name)
    size = v.getattr(ROOT_INO).size
    return assemble(v.read_plan(ROOT_INO, 0, size), repo.get)


def test_grow_shrink_and_grow_back(store: Path, repo: Repository) -> None:
    volumes.create_volume(repo, "vm", volumes.Source(blank_block=1 << 20))
    data = os.urandom(1 << 20)
    v = open_volume(repo, "vm")
    v.write_sync(ROOT_INO, 0, data)
    v.close()

    r = casfs(store, "volume", "resize", "vm", "3M")
    assert r.returncode == 0, r.stderr
    assert contents(repo, "vm") == data + bytes(2 << 20)

    r = casfs(store, "volume", "resize", "vm", "100K")
    assert r.returncode == 2 and "--allow-shrink" in r.stderr and len(r.stderr.splitlines()) == 1
    assert contents(repo, "vm") == data + bytes(2 << 20)  # refused: nothing changed

    cut = 100 * 1024 + 7  # not on a chunk boundary
    r = casfs(store, "volume", "resize", "vm", str(cut), "--allow-shrink")
    assert r.returncode == 0, r.stderr
    assert contents(repo, "vm") == data[:cut]
    assert casfs(store, "volume", "resize", "vm", "1M").returncode == 0
    assert contents(repo, "vm") == data[:cut] + bytes((1 << 20) - cut)  # the cut bytes stay gone

    info = json.loads(casfs(store, "volume", "info", "vm", "--json").stdout)
    assert info["size"] == 1 << 20


def test_directory_volumes_have_no_size_to_set(store: Path, repo: Repository) -> None:
    volumes.create_volume(repo, "d", volumes.Source(blank_dir=True))
    r = casfs(store, "volume", "resize", "d", "1G")
    assert r.returncode == 2 and "directory volume" in r.stderr
    assert casfs(store, "volume", "resize", "nope", "1G").returncode == 3


def test_a_volume_over_the_size_limit_from_an_older_casfs(
    store: Path, repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block volume of 16 TiB (allowed before the limit; ext4 could not hold its upper
    file): repeating its create still succeeds, a read/write clone of its snapshot is
    refused up front (its writes would fail with EFBIG), a read-only one is made."""
    with monkeypatch.context() as older:
        older.setattr(kinds, "MAX_BLOCK_SIZE", 16 << 40)
        volumes.create_volume(repo, "old", volumes.Source(blank_block=16 << 40))
    volumes.create_snapshot(repo, "old")

    r = casfs(store, "volume", "create", "old", "--blank-block", "16T")
    assert r.returncode == 0, r.stderr
    r = casfs(store, "volume", "create", "new", "--blank-block", "16T")
    assert r.returncode == 2 and "at most 16 TiB less 1 MiB" in r.stderr
    r = casfs(store, "volume", "create", "rw", "--from", "old@1")
    assert r.returncode == 2 and "at most 16 TiB less 1 MiB" in r.stderr
    r = casfs(store, "volume", "create", "ro", "--from", "old@1", "--ro")
    assert r.returncode == 0, r.stderr
    names = {v["name"] for v in json.loads(casfs(store, "volume", "ls", "--json").stdout)}
    assert names == {"old", "ro"}
