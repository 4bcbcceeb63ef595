"""Where an active or view snapshot is mounted: one `casfs mount` daemon per snapshot,
at ROOT/VOLUME, started as the launcher starts every mount (in its own session, so it
outlives the snapshotter: a running container keeps its rootfs across a restart).
The runtime gets a bind mount of that directory.

One daemon per snapshot, not one whole-store mount: a container's writes are folded
and snapshotted by its own daemon on Commit, a Remove ends only that one, and a
crashed daemon takes down one container's rootfs, not every one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from pathlib import Path

from casfs.errors import NotFound
from casfs.fuse.launcher import Config, live_mounts, start_daemon, unmount
from casfs.fuse.mountinfo import find_mount, mounts
from casfs.grpcsvc.codes import InUse

log = logging.getLogger("casfs.snapshotter")


class Mounts:
    def __init__(self, store: Path, root: Path) -> None:
        self.store, self.root = store, root

    def path(self, volume: str) -> str:
        return str(self.root / volume)

    def ensure(self, volume: str, read_only: bool) -> str:
        """The volume mounted at its path (started if its daemon is not live: a dead
        one's mount is detached first); the path."""
        where = self.path(volume)
        if live_mounts(self.store).get(volume) == where:
            return where
        self._detach(where)
        os.makedirs(where, exist_ok=True)
        cfg = Config(self.store, where, volume=volume, read_only=read_only, allow_other=True)
        for warning in start_daemon(cfg):
            log.warning("volume %s: %s", volume, warning)
        return where

    def binds(self, volume: str) -> list[str]:
        """Where else the volume's mount is bound (a container's rootfs, a `ctr
        snapshots mounts` target): unmounting it then would wait for those to go."""
        where = self.path(volume)
        entry = find_mount(where)
        if entry is None:
            return []
        return [m.mountpoint for m in mounts() if m.device == entry.device and m.mountpoint != where]

    def stop(self, volume: str) -> list[str]:
        """Unmount (the daemon saves and folds what was written); the snapshots its
        unmount took (VOL@N). Nothing mounted: nothing to do. InUse while it is bound
        elsewhere (a running container's rootfs)."""
        where = self.path(volume)
        taken: list[str] = []
        used = self.binds(volume)
        if used:
            raise InUse(f"snapshot volume {volume} is still mounted at {', '.join(used[:3])}")
        if live_mounts(self.store).get(volume) == where:
            with contextlib.suppress(NotFound):
                taken = unmount(where)
        else:
            self._detach(where)
        with contextlib.suppress(OSError):
            os.rmdir(where)
        return taken

    def _detach(self, where: str) -> None:
        """A mount left by a daemon that died (ENOTCONN to every call) is detached."""
        if find_mount(where) is not None:
            subprocess.run(["fusermount3", "-u", "-z", where], capture_output=True, check=False)
