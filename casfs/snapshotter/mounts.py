"""Where active and view snapshots are mounted: ONE whole-store `casfs mount` daemon at
ROOT/store serves them all (its volumes/NAME), and the runtime gets a bind mount of
volumes/VOLUME. A Prepare is then a clone (milliseconds) where a daemon per snapshot
cost a Python start and a FUSE init (0.85 s here) and its unmount at Remove 0.26 s.

The daemon is started as the launcher starts every mount, in its own session: it
outlives the snapshotter, so running containers keep their rootfs across a restart.
A dead one is found at the next Prepare, Mounts, Commit or Remove (and at start):
its claims are recovered, its mount detached, a new one started. The binds that
running containers hold on the dead one stay broken (ENOTCONN) until they restart.

A Commit or Remove lets go of the volume by `user.casfs.release` on volumes/VOLUME
(flushed, its claim released: the volume is at rest, the overlay holding its changes);
refused (InUse) while the volume is bound elsewhere, as a running container's rootfs.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from pathlib import Path

from casfs.errors import CasfsError, UsageError
from casfs.fuse.launcher import Config, running_mounts, start_daemon
from casfs.fuse.mountinfo import find_mount, mounts
from casfs.grpcsvc.codes import InUse
from casfs.repo import Repository

log = logging.getLogger("casfs.snapshotter")
RELEASE = "user.casfs.release"


class Mounts:
    def __init__(self, repo: Repository, root: Path) -> None:
        self.repo = repo
        self.mountpoint = str(root / "store")

    def path(self, volume: str) -> str:
        return os.path.join(self.mountpoint, "volumes", volume)

    def ensure(self) -> None:
        """The whole-store mount served by a live daemon (started if not: what a dead
        one left is recovered and detached first)."""
        if self._live():
            return
        from casfs.upkeep.recovery import recover

        for message in recover(self.repo):  # (the dead daemon's claims)
            log.info("recovered: %s", message)
        if find_mount(self.mountpoint) is not None:
            subprocess.run(["fusermount3", "-u", "-z", self.mountpoint], capture_output=True, check=False)
        os.makedirs(self.mountpoint, exist_ok=True)
        cfg = Config(self.repo.path, self.mountpoint, allow_other=True, suid=True)  # (rootfs: as overlayfs)
        for warning in start_daemon(cfg):
            log.warning("store mount: %s", warning)
        log.info("store mount started at %s", self.mountpoint)

    def binds(self, volume: str) -> list[str]:
        """Where the volume is bound (a container's rootfs, a `ctr snapshots mounts`
        target): a bind of a mount of this store whose root is the volume's path (on
        the live store mount, or on one whose daemon died)."""
        source, inside = f"casfs:{self.repo.path}", f"/volumes/{volume}"
        ours = [m for m in mounts() if m.is_casfs and m.source == source]
        return [m.mountpoint for m in ours if _under(m.root, inside)]

    def release(self, volume: str) -> None:
        """The volume at rest, its changes in its overlay: InUse while it is bound."""
        used = self.binds(volume)
        if used:
            raise InUse(f"snapshot volume {volume} is still mounted at {', '.join(used[:3])}")
        self.ensure()  # (a dead daemon's claim: recovered by the restart)
        try:
            os.setxattr(self.path(volume), RELEASE, b"")
        except FileNotFoundError:
            return  # (not served: not a volume any more, or never made)
        except OSError as e:
            if e.errno == errno.EINVAL:
                raise UsageError(f"{self.mountpoint} cannot release volume {volume}") from None
            raise CasfsError(f"releasing volume {volume}: {os.strerror(e.errno or errno.EIO)}") from None

    def _live(self) -> bool:
        return any(r.get("mountpoint") == self.mountpoint for r in running_mounts(self.repo.path))


def _under(root: str, inside: str) -> bool:
    return root == inside or root.startswith(inside + "/")
