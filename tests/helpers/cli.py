"""Commands in subprocesses, always with a timeout: the real `casfs` command line as a
user runs it (`python -m casfs -s STORE ...`, none of the caller's CASFS_* variables,
daemons with entry/attr timeouts of 0), and any other tool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

CLI = [sys.executable, "-m", "casfs"]
# `python -m casfs` (argv: sys.argv) run inside a probing interpreter, which then looks
# at what it loaded: the os._exit that ends the program (casfs.cli.run) raises SystemExit
# there instead; `code` is its exit code.
RUN_IN_PROBE = (
    "import os, runpy\n"
    "def _exit(code):\n    raise SystemExit(code)\n"
    "os._exit = _exit\n"
    "try:\n    runpy.run_module('casfs', run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
)
TIMEOUT = 120.0  # a casfs command
CALL_TIMEOUT = 60.0  # any other tool

Completed = subprocess.CompletedProcess[str]


def env(**extra: str) -> dict[str, str]:
    """This process's environment without CASFS_* (a test sets what it means), plus `extra`."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("CASFS_")}
    out.update(extra)
    return out


def run(
    cmd: Sequence[str | Path],
    timeout: float = CALL_TIMEOUT,
    check: bool = False,
    env: dict[str, str] | None = None,
) -> Completed:
    return subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=check, env=env
    )


def must(*cmd: str | Path, timeout: float = CALL_TIMEOUT) -> str:
    """Run a tool that must succeed; its stdout."""
    done = run(cmd, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}: {done.returncode}\n{done.stdout}{done.stderr}"
    return done.stdout


def casfs(store: Path | None, *args: str | Path, timeout: float = TIMEOUT, **extra_env: str) -> Completed:
    """`casfs -s STORE ARGS` (no -s without a store); `extra_env` such as CASFS_FAULT."""
    where = ["-s", str(store)] if store is not None else []
    if args and args[0] == "mount" and not passthrough_wanted() and "--no-passthrough" not in args:
        args = (*args, "--no-passthrough")
    return run([*CLI, *where, *args], timeout=timeout, env=env(CASFS_TEST_TIMEOUTS="0", **extra_env))


def passthrough_wanted() -> bool:
    """The mode mount tests run in, CASFS_TEST_PASSTHROUGH=on (the default) or off
    (--no-passthrough: the daemon serves every byte, a writable mount has the writeback
    cache); scripts/test.sh runs the mount tests both ways."""
    mode = os.environ.get("CASFS_TEST_PASSTHROUGH", "on")
    assert mode in ("on", "off"), f"CASFS_TEST_PASSTHROUGH={mode!r}: on or off"
    return mode == "on"


def needs_passthrough() -> pytest.MarkDecorator:
    """For a module of passthrough's own tests (`pytestmark = needs_passthrough()`): the
    run with CASFS_TEST_PASSTHROUGH=off skips it (it ran in the default mode)."""
    return pytest.mark.skipif(not passthrough_wanted(), reason="passthrough's own tests: the mode is off")


def ok(store: Path, *args: str | Path, timeout: float = TIMEOUT, **extra_env: str) -> Completed:
    """A casfs command that must exit 0."""
    p = casfs(store, *args, timeout=timeout, **extra_env)
    assert p.returncode == 0, (args, p.returncode, p.stdout, p.stderr)
    return p


def out(store: Path, *args: str | Path, timeout: float = TIMEOUT) -> str:
    """A casfs command that must exit 0: its stdout."""
    return ok(store, *args, timeout=timeout).stdout


def js(store: Path, *args: str | Path) -> Any:
    """A casfs command that must exit 0, with --json: its output parsed."""
    return json.loads(out(store, *args, "--json"))


def fails(store: Path | None, code: int, *args: str | Path) -> str:
    """A casfs command that must fail with `code` and say why in one stderr line: that line."""
    p = casfs(store, *args)
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("casfs: error: "), p.stderr
    return lines[0]


def killed_at(store: Path, fault: str, *args: str | Path) -> None:
    """Run a command that must SIGKILL itself at the fault point `fault`."""
    p = casfs(store, *args, CASFS_FAULT=fault)
    assert p.returncode == -signal.SIGKILL, (fault, p.returncode, p.stdout, p.stderr)


def recovered(p: Completed) -> list[str]:
    """What a command said it recovered (one stderr line each)."""
    prefix = "casfs: recovered: "
    return [line.removeprefix(prefix) for line in p.stderr.splitlines() if line.startswith(prefix)]
