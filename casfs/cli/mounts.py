"""`casfs mount` and `casfs umount`: handed to the launcher, which starts the daemon
(another process) and talks to it. Neither loads trio or pyfuse3 (a mount's start-up
would pay for them twice); only `mount --foreground` serves here, through the daemon."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from casfs.fuse.launcher import Config


def cmd_mount(args: argparse.Namespace) -> int:
    from casfs.fuse.launcher import mount_main
    from casfs.repo import store_path

    args.store_path = store_path(args.store)
    from casfs.cli.replicas import before_mount

    reg = before_mount(args)  # (a replicated volume: `active` here, caught up)
    try:
        return int(mount_main(args, _serve_here))
    except BaseException:
        if reg is not None:
            from casfs.replica.active import release
            from casfs.replica.registry import node_name

            release(reg, args.volume, node_name(args.node))
        raise


def _serve_here(cfg: Config) -> int:
    """`casfs mount --foreground`: the daemon in this process."""
    from casfs.fuse.daemon import run_daemon

    return run_daemon(cfg)


def cmd_umount(args: argparse.Namespace) -> int:
    import os

    from casfs.fuse.launcher import served_volume, umount_main  # (the client side: no trio, no pyfuse3)
    from casfs.fuse.mountinfo import find_mount

    entry = find_mount(os.path.abspath(args.mountpoint))
    store = entry.source.removeprefix("casfs:") if entry is not None and entry.is_casfs else None
    volume = None if store is None else served_volume(Path(store), os.path.abspath(args.mountpoint))[0]
    code = int(umount_main(args))
    from casfs.cli.replicas import after_umount

    after_umount(args, store, volume)  # (replicated: the snapshot published, `active` released)
    return code
