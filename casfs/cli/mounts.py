"""`casfs mount` and `casfs umount`: handed to the daemon's entry points, imported here
and only here, so that no other command loads trio or pyfuse3 (and `umount`, a client
of the daemon, loads neither)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse


def cmd_mount(args: argparse.Namespace) -> int:
    from casfs.fuse.daemon import mount_main
    from casfs.repo import store_path

    args.store_path = store_path(args.store)
    return int(mount_main(args))


def cmd_umount(args: argparse.Namespace) -> int:
    from casfs.fuse.launcher import umount_main  # (the client side: no trio, no pyfuse3)

    return int(umount_main(args))
