"""Repeated pulls over real ssh share one ssh connection and one server on the source
(replica.sharing): reused while up, started again when gone, ended when idle, and
never used when turned off or when the source's casfs cannot serve on a socket."""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

from casfs.replica.sharing import master_pid, server_name, server_pid
from tests.helpers.procs import alive
from tests.replica.conftest import Sshd
from tests.replica.helpers import MiB, block_volume, cli, exported, snapshot, write_block


def pull(store: Path, sshd: Sshd, source: str, remote: str | None = None, **env: str) -> dict[str, object]:
    p = cli(
        store, "pull", source, "vm1", "--json", "--remote-casfs", remote or sshd.remote,
        extra={"CASFS_SSH": sshd.ssh, **env},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc: dict[str, object] = json.loads(p.stdout)
    return doc


def pids(sshd: Sshd, source: str, remote: str | None = None) -> tuple[int | None, int | None]:
    """(the master's pid, the server's pid), as the CLI's environment finds them."""
    os.environ["CASFS_SSH"] = sshd.ssh
    try:
        return master_pid(source), server_pid(source, remote or sshd.remote, sshd.far / "casfs-ssh")
    finally:
        del os.environ["CASFS_SSH"]


def one_volume(two: tuple[Path, Path], tmp_path: Path, sshd: Sshd) -> tuple[Path, Path, str]:
    """Stores a (vm1@1, 4 MiB) and b, and a's ssh:// URL."""
    a, b = two
    block_volume(a, tmp_path, "vm1", 4 * MiB, os.urandom(MiB))
    snapshot(a, "vm1")
    return a, b, sshd.url(a)


def older_casfs(tmp_path: Path, sshd: Sshd, option: str) -> Path:
    """A casfs for the far side that refuses `option` (usage, exit 2), as an older one."""
    older = tmp_path / f"older-casfs{option}"
    older.write_text(
        f'#!/bin/sh\ncase "$*" in *{option}*) echo "casfs: error: unrecognized arguments" >&2; exit 2;;'
        " esac\n"
        f'exec {sshd.remote} "$@"\n'
    )
    older.chmod(0o755)
    return older


def wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_repeated_pulls_reuse_one_connection_and_server(
    two: tuple[Path, Path], tmp_path: Path, sshd: Sshd
) -> None:
    a, b = two
    url = sshd.url(a)
    block_volume(a, tmp_path, "vm1", 8 * MiB, os.urandom(2 * MiB))
    snapshot(a, "vm1")
    assert pull(b, sshd, url)["plan"] == "new"
    master, server = pids(sshd, url)
    assert master is not None and server is not None and alive(master) and alive(server)
    assert not (sshd.here / "casfs-ssh").stat().st_mode & 0o077  # (a private directory)
    assert stat.S_ISSOCK((sshd.far / "casfs-ssh" / f"{server_name(url, sshd.remote)}.sock").lstat().st_mode)
    n = write_block(a, "vm1", [(MiB, os.urandom(256 << 10))])
    assert pull(b, sshd, url)["n"] == n
    assert pids(sshd, url) == (master, server)  # nothing started again
    # The server killed (or gone idle): the next pull starts another, and lands the same.
    os.kill(server, signal.SIGKILL)
    assert wait_gone(server, 20)
    n = write_block(a, "vm1", [(3 * MiB, os.urandom(256 << 10))])
    assert pull(b, sshd, url)["n"] == n
    again = pids(sshd, url)
    assert again[0] == master and again[1] not in (None, server)
    assert exported(a, f"vm1@{n}", tmp_path / "a.img") == exported(b, f"vm1@{n}", tmp_path / "b.img")


def test_a_new_master_finds_the_server_up(two: tuple[Path, Path], tmp_path: Path, sshd: Sshd) -> None:
    """The master gone (idle, killed), its forwarded socket is left behind: the next pull
    makes another master, finds the server up (a second start waits for nothing), and
    forwards to it again."""
    a, b, url = one_volume(two, tmp_path, sshd)
    pull(b, sshd, url)
    master, server = pids(sshd, url)
    assert master is not None and server is not None
    os.kill(master, signal.SIGTERM)
    assert wait_gone(master, 20)
    n = write_block(a, "vm1", [(0, os.urandom(256 << 10))])
    started = time.monotonic()
    assert pull(b, sshd, url)["n"] == n
    assert time.monotonic() - started < 30  # (not waiting for the server to go idle)
    again = pids(sshd, url)
    assert again[1] == server and again[0] not in (None, master)


def test_both_end_on_their_own_when_idle(two: tuple[Path, Path], tmp_path: Path, sshd: Sshd) -> None:
    _, b, url = one_volume(two, tmp_path, sshd)
    pull(b, sshd, url, CASFS_SSH_PERSIST="2")
    master, server = pids(sshd, url)
    assert master is not None and server is not None
    assert wait_gone(server, 30) and wait_gone(master, 30)
    name = server_name(url, sshd.remote)
    assert list((sshd.far / "casfs-ssh").glob(f"{name}.*")) == []  # (its socket and pid file removed)


def test_nothing_is_shared_when_turned_off(two: tuple[Path, Path], tmp_path: Path, sshd: Sshd) -> None:
    _, b, url = one_volume(two, tmp_path, sshd)
    assert pull(b, sshd, url, CASFS_SSH_PERSIST="0")["plan"] == "new"
    assert sshd.shared() == {}


def test_a_source_without_a_socket_server_is_served_in_a_session(
    two: tuple[Path, Path], tmp_path: Path, sshd: Sshd
) -> None:
    """An older casfs on the source refuses --listen (usage, exit 2): the pull goes on
    as without sharing, over one session (through the shared ssh connection)."""
    _, b, url = one_volume(two, tmp_path, sshd)
    old = older_casfs(tmp_path, sshd, "--listen")
    assert pull(b, sshd, url, str(old))["plan"] == "new"
    assert pids(sshd, url, str(old))[1] is None


def test_a_source_that_cannot_serve_a_session_too_starts_its_server_apart(
    two: tuple[Path, Path], tmp_path: Path, sshd: Sshd
) -> None:
    """A casfs on the source with --listen but not --stdio (usage, exit 2): the server
    is started by a session of its own and forwarded to, and the next pull reuses it."""
    a, b, url = one_volume(two, tmp_path, sshd)
    older = older_casfs(tmp_path, sshd, "--stdio")
    assert pull(b, sshd, url, str(older))["plan"] == "new"
    master, server = pids(sshd, url, str(older))
    assert master is not None and server is not None
    n = write_block(a, "vm1", [(0, os.urandom(256 << 10))])
    assert pull(b, sshd, url, str(older))["n"] == n
    assert pids(sshd, url, str(older)) == (master, server)


def test_a_source_with_no_private_directory_serves_the_session_all_the_same(
    two: tuple[Path, Path], tmp_path: Path, sshd: Sshd
) -> None:
    """The source's directory of sockets is not private: no server is kept up there, and
    the pull's own session is served (`not listening: …`)."""
    _, b, url = one_volume(two, tmp_path, sshd)
    shared = tmp_path / "run"
    (shared / "casfs-ssh").mkdir(parents=True, mode=0o755)
    (shared / "casfs-ssh").chmod(0o755)
    remote = sshd.remote.replace(f"XDG_RUNTIME_DIR={sshd.far}", f"XDG_RUNTIME_DIR={shared}")
    assert pull(b, sshd, url, remote)["plan"] == "new"
    assert list((shared / "casfs-ssh").iterdir()) == []
