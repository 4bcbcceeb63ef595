"""`casfs mount` and `casfs umount`: handed to the launcher, which starts the daemon
(another process) and talks to it. Neither loads trio or pyfuse3 (a mount's start-up
would pay for them twice); only `mount --foreground` serves here, through the daemon."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from casfs.fuse.launcher import Config


def cmd_mount(args: argparse.Namespace) -> int:
    from casfs.fuse.launcher import mount_main
    from casfs.repo import store_path

    args.store_path = store_path(args.store)
    return int(mount_main(args, _serve_here))


def _serve_here(cfg: Config) -> int:
    """`casfs mount --foreground`: the daemon in this process."""
    from casfs.fuse.daemon import run_daemon

    return run_daemon(cfg)


def cmd_umount(args: argparse.Namespace) -> int:
    from casfs.fuse.launcher import umount_main  # (the client side: no trio, no pyfuse3)

    return int(umount_main(args))
