"""Fixtures of the replica tests: two empty stores (`two`), and a real sshd on
127.0.0.1, a free port, a throwaway host key and user key in a temporary directory,
key logins only; stopped by its pid."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from casfs.repo import Repository
from tests.helpers.fsck import Stores

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

    def url(self, store: Path) -> str:
        return f"ssh://{os.environ.get('USER', 'root')}@127.0.0.1:{self.port}{store}"


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
        yield Sshd(port, ssh, f"env PYTHONPATH={ROOT} {sys.executable} -m casfs")
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
