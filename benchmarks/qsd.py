"""qemu-storage-daemon's FUSE export as a benchmark peer: the C program a hypervisor
host would otherwise use to present a disk image as a file, over the same FUSE.

Two shapes of the same base image, as issue 8 compares them:

  raw    a raw copy of the image, exported as it is (the ceiling: no format at all)
  qcow2  a qcow2 overlay whose backing file is the raw image (what a clone is in
         qemu's world: `qemu-img create -b BASE -F raw`), writes go to the overlay

The daemon runs in the background with a pid file and is stopped by that pid
(SIGTERM makes it unmount its export and exit; an outside `fusermount3 -u` does not
end it). Installed by scripts/install-bench.sh (Debian: qemu-system-common).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from benchlib import is_mounted, sh, unmount


class Qsd:
    """One qemu-storage-daemon exporting `image` (raw, or a qcow2 overlay made over a
    raw backing file) read/write on the regular file `mnt`; restartable."""

    def __init__(self, image: Path, mnt: Path, fmt: str) -> None:
        if fmt not in ("raw", "qcow2"):
            raise ValueError(f"qsd format {fmt!r}: raw or qcow2")
        self.image, self.mnt, self.fmt = image, mnt, fmt
        self.pidfile = mnt.with_name(mnt.name + ".pid")
        self.pid: int | None = None

    @classmethod
    def overlay(cls, backing: Path, overlay: Path, mnt: Path) -> Qsd:
        """A fresh qcow2 overlay of `backing` (a clone in qemu's terms: O(1))."""
        overlay.unlink(missing_ok=True)
        sh("qemu-img", "create", "-q", "-f", "qcow2", "-b", backing, "-F", "raw", overlay, timeout=60)
        return cls(overlay, mnt, "qcow2")

    def mount(self) -> None:
        self.mnt.touch()
        self.pidfile.unlink(missing_ok=True)
        node = f"driver={self.fmt},node-name=disk,file=file"
        try:
            sh(
                "qemu-storage-daemon",
                "--blockdev", f"driver=file,node-name=file,filename={self.image}",
                "--blockdev", node,
                "--export", f"type=fuse,id=export,node-name=disk,mountpoint={self.mnt},writable=on",
                "--daemonize", "--pidfile", self.pidfile,
                timeout=60,
            )  # fmt: skip
        finally:
            # Even when cut short: a daemon that wrote its pid file is stopped by umount().
            with contextlib.suppress(OSError, ValueError):
                self.pid = int(self.pidfile.read_text())
        if self.pid is None:
            raise RuntimeError(f"qemu-storage-daemon wrote no pid to {self.pidfile}")
        widen_read_ahead(self.mnt)

    def umount(self) -> None:
        """SIGTERM by pid and wait for the export to go; a stuck one is forced."""
        pid, self.pid = self.pid, None
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if is_mounted(self.mnt):
            unmount(self.mnt)

    def restart(self) -> None:
        self.umount()
        self.mount()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours counts as gone once reaped; qsd daemonizes, so it is not ours.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return Path(f"/proc/{pid}").exists()


def available() -> bool:
    return subprocess.run(["which", "qemu-storage-daemon"], capture_output=True).returncode == 0


def widen_read_ahead(mnt: Path, kib: int = 1024) -> None:
    """The FUSE mount's kernel read-ahead raised as casfs's daemon raises its own (1 MiB
    instead of 128 KiB), so cold sequential reads compare the daemons, not the setting."""
    st = os.stat(mnt)
    path = Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb")
    with contextlib.suppress(OSError):
        if int(path.read_text()) < kib:
            path.write_text(str(kib))
