"""casfs.fuse.killpriv's reading of an opener's CAP_FSETID, and its rules."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from casfs.fuse import killpriv

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a process without CAP_FSETID)")


def test_an_opener_without_cap_fsetid_does_not_keep_set_id_bits() -> None:
    assert killpriv.opener_may_keep(os.getpid())
    nobody = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{nobody.pid}/comm").read_text().strip() != "sleep":  # (setpriv has run)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not killpriv.opener_may_keep(nobody.pid)
    finally:
        nobody.kill()
        nobody.wait()
    assert not killpriv.opener_may_keep(nobody.pid)  # (gone: unknown counts as lacking)


def test_what_clearing_changes() -> None:
    reg = stat.S_IFREG
    assert killpriv.would_clear(reg | 0o4755) and killpriv.would_clear(reg | 0o2775)
    assert not killpriv.would_clear(reg | 0o2665)  # (setgid without group exec stays)
    assert not killpriv.would_clear(reg | 0o755) and not killpriv.would_clear(stat.S_IFDIR | 0o2775)
