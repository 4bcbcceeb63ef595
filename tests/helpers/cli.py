"""Helpers for the lifecycle tests: the real `casfs` command in subprocesses, and a
look at a store's catalog and files that does not go through casfs (so it neither
recovers nor changes anything)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

TIMEOUT = 120
CLI = [sys.executable, "-m", "casfs"]


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("CASFS_")}
    out.update(extra)
    return out


def casfs(store: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "-s", str(store), *args], capture_output=True, text=True, timeout=TIMEOUT, env=env(**extra_env)
    )


def ok(store: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    p = casfs(store, *args, **extra_env)
    assert p.returncode == 0, (args, p.stdout, p.stderr)
    return p


def js(store: Path, *args: str) -> Any:
    return json.loads(ok(store, *args, "--json").stdout)


def killed_at(store: Path, fault: str, *args: str) -> None:
    """Run a command that must SIGKILL itself at the fault point `fault`."""
    p = casfs(store, *args, CASFS_FAULT=fault)
    assert p.returncode == -signal.SIGKILL, (fault, p.returncode, p.stdout, p.stderr)


def query(store: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{store / 'catalog.db'}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def blob_files(store: Path) -> set[str]:
    return {p.name for p in (store / "blobs").glob("*/*")}


def tmp_files(store: Path) -> list[str]:
    return [str(p.relative_to(store)) for p in (store / "tmp").rglob("*")]


def assert_consistent(store: Path) -> None:
    """fsck is clean, every blob file has a row (no orphans), nothing is left staged."""
    p = casfs(store, "fsck")
    assert p.returncode == 0, (p.stdout, p.stderr)
    rows = {bytes(r[0]).hex() for r in query(store, "SELECT id FROM blobs")}
    assert blob_files(store) == rows
    assert tmp_files(store) == []


def recovered(p: subprocess.CompletedProcess[str]) -> list[str]:
    prefix = "casfs: recovered: "
    return [line.removeprefix(prefix) for line in p.stderr.splitlines() if line.startswith(prefix)]
