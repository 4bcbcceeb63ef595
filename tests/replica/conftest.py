"""Fixtures of the replica tests: two empty stores (`two`), and a real sshd on
127.0.0.1, a free port, a throwaway host key and user key in a temporary directory,
key logins only; stopped by its pid.

Pulls over ssh share a connection and a server on the source (replica.sharing), which
outlive a pull by design: the sshd fixture gives this side and the source side private
directories of their own ($XDG_RUNTIME_DIR here, and in the remote command there), and
after each test that used it (and once more at the end) ends every ssh master and
server found there by pid, and waits until they are gone."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from casfs.repo import Repository
from tests.helpers.fsck import Stores
from tests.helpers.procs import alive  # (a master whose parent exited: a zombie till init reaps it)

SSHD = Path("/usr/sbin/sshd")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def two(tmp_path: Path, stores: Stores) -> tuple[Path, Path]:
    """Stores a and b, empty, keeping their own blobs (fsck'd when the test ends)."""
    a, b = stores.add(tmp_path / "a"), stores.add(tmp_path / "b")
    for s in (a, b):
        Repository.init(s).close()
    return a, b


@dataclass(frozen=True)
class Sshd:
    port: int
    ssh: str  # a CASFS_SSH value that logs in with the throwaway key
    remote: str  # the casfs command on the far side: this checkout, this interpreter
    here: Path  # this side's $XDG_RUNTIME_DIR (shared ssh connections' sockets)
    far: Path  # the far side's (its servers' sockets and pid files)

    def url(self, store: Path) -> str:
        return f"ssh://{os.environ.get('USER', 'root')}@127.0.0.1:{self.port}{store}"

    def shared(self) -> dict[str, int]:
        """The ssh masters and source-side servers up now: {what: pid}."""
        found: dict[str, int] = {}
        for pid_file in (self.far / "casfs-ssh").glob("serve-*.pid"):
            with contextlib.suppress(OSError, ValueError):
                found[pid_file.name] = int(pid_file.read_text())
        for sock in (self.here / "casfs-ssh").glob("*"):
            if sock.name.startswith("fwd-"):
                continue
            done = subprocess.run(
                [*self.ssh.split(), "-o", f"ControlPath={sock}", "-O", "check", "x"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if m := re.search(r"\(pid=(\d+)\)", done.stderr):
                found[sock.name] = int(m.group(1))
        return {what: pid for what, pid in found.items() if alive(pid)}

    def stop_shared(self) -> None:
        """End every master and server by pid; fail if one does not go."""
        left = self.shared()
        for pid in left.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while any(alive(p) for p in left.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in left.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not [w for w, p in left.items() if alive(p)], left


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not SSHD.exists():
        pytest.skip("openssh-server is not installed (scripts/install.sh installs it)")
    d = tmp_path_factory.mktemp("sshd")
    _keygen(d / "host")
    _keygen(d / "user")
    (d / "authorized_keys").write_text((d / "user.pub").read_text())
    port = _free_port()
    host_pub = (d / "host.pub").read_text().split()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    config = d / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
        "StrictModes no\nUsePAM no\nLogLevel ERROR\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # (privilege separation wants it)
    proc = subprocess.Popen([str(SSHD), "-D", "-f", str(config), "-E", str(d / "log")])
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"sshd did not start: {(d / 'log').read_text()}") from None
                time.sleep(0.05)
        ssh = (
            f"ssh -F /dev/null -i {d / 'user'} -o IdentitiesOnly=yes -o BatchMode=yes "
            f"-o UserKnownHostsFile={d / 'known_hosts'} -o StrictHostKeyChecking=yes"
        )
        # (short: a socket's path is at most 107 bytes, pytest's temporary paths are long)
        here, far = (Path(tempfile.mkdtemp(prefix=f"casfs-{side}-")) for side in ("here", "far"))
        remote = f"env PYTHONPATH={ROOT} XDG_RUNTIME_DIR={far} {sys.executable} -m casfs"
        server = Sshd(port, ssh, remote, here, far)
        before = os.environ.get("XDG_RUNTIME_DIR")
        os.environ["XDG_RUNTIME_DIR"] = str(here)  # (the CLI's subprocesses inherit it)
        try:
            yield server
        finally:
            if before is None:
                del os.environ["XDG_RUNTIME_DIR"]
            else:
                os.environ["XDG_RUNTIME_DIR"] = before
            server.stop_shared()
            for run_dir in (here, far):
                shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(autouse=True)
def _no_shared_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that pulled over ssh: no ssh master nor source-side server is left."""
    yield
    if "sshd" in request.fixturenames:
        server: Sshd = request.getfixturevalue("sshd")
        server.stop_shared()
