"""The node's kernel objects the Node service makes: bind mounts and loop devices, by
mount(8), umount(8) and losetup(8). Each failure is a CasfsError with the tool's own
last line; every call has a timeout."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from casfs.errors import CasfsError
from casfs.fuse.mountinfo import MountEntry, mounts

TIMEOUT_S = 60.0


def run(cmd: list[str], what: str) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CasfsError(f"{what}: {cmd[0]} did not finish in {TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise CasfsError(f"{what}: {lines[-1] if lines else f'{cmd[0]} exited {done.returncode}'}")
    return done.stdout


def mount_at(path: str) -> MountEntry | None:
    """The topmost mount at exactly `path` (from mountinfo: never a stat of the path)."""
    found = None
    for entry in mounts():
        if entry.mountpoint == path:
            found = entry
    return found


def mounts_of_device(device: str) -> list[MountEntry]:
    """Every mount of one filesystem (major:minor): a staged volume and its binds."""
    return [m for m in mounts() if m.device == device]


def bind(source: str, target: str, read_only: bool, flags: list[str]) -> None:
    """Bind-mount `source` at `target`, then remount the bind with the options asked
    (a bind takes them only by a remount); undone if the remount fails."""
    run(["mount", "--bind", source, target], f"binding {source} at {target}")
    options = (["ro"] if read_only else []) + [f for f in flags if f not in ("ro", "rw")]
    if not options:
        return
    try:
        run(["mount", "-o", ",".join(["remount", "bind", *options]), target], f"remounting {target}")
    except CasfsError:
        unmount(target)
        raise


def unmount(target: str) -> None:
    run(["umount", target], f"unmounting {target}")


def attach_loop(file: str, read_only: bool) -> str:
    """A new loop device over `file` (direct I/O: the page cache is the mount's, not
    the loop device's too); its path."""
    cmd = ["losetup", "--find", "--show", "--direct-io=on", *(["--read-only"] if read_only else []), file]
    return run(cmd, f"attaching a loop device to {file}").strip()


def detach_loop(device: str) -> None:
    run(["losetup", "--detach", device], f"detaching {device}")


def refresh_loop(device: str) -> None:
    """The loop device takes its backing file's size again (after a resize)."""
    run(["losetup", "--set-capacity", device], f"resizing {device}")


def loop_backing(device: str) -> str | None:
    """The backing file of /dev/loopN, or None if it is not attached."""
    name = os.path.basename(device)
    try:
        return Path(f"/sys/block/{name}/loop/backing_file").read_text().strip()
    except OSError:
        return None


def loops_of(file: str) -> list[str]:
    """The loop devices attached to `file`."""
    found = []
    for path in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if path.read_text().strip() == file:
                found.append("/dev/" + path.parts[3])
        except OSError:
            continue
    return sorted(found)


def loop_of_bind(entry: MountEntry) -> str | None:
    """The loop device a bind mount of its device node shows (root `/loopN` on /dev's fs)."""
    name = entry.root.lstrip("/")
    return f"/dev/{name}" if name.startswith("loop") and name[4:].isdigit() else None
