"""`casfs volume bundle VOL DIR`: an OCI runtime bundle for a volume made from an OCI
image. The volume is mounted at DIR/rootfs (read/write, --allow-other so the image's
own user may use it; an existing mount of it there is reused), or --rootfs names where
it is mounted already; DIR/config.json runs the image's entrypoint + cmd with its env,
working dir and user, its root.path the mount. `runc run -b DIR ID` then starts it;
`casfs umount DIR/rootfs` ends the mount once the container is deleted."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from casfs.cli.store import open_store
from casfs.errors import Busy, NotFound, UsageError

if TYPE_CHECKING:
    from casfs.repo import Repository


def cmd_bundle(args: argparse.Namespace) -> int:
    from casfs.importers.oci.runtime import runtime_config
    from casfs.volumes import get_volume

    bundle = Path(args.dir).absolute()
    with open_store(args) as repo:
        info = get_volume(repo, args.name)
        if info.kind != "dir":
            raise UsageError(f"volume {args.name!r} is a block volume: a container needs a directory")
        oci = image_config(repo, args.name)
        store = repo.path
    read_only = info.mode == "ro"
    if args.rootfs is not None:
        rootfs = Path(args.rootfs).absolute()
        if not rootfs.is_dir():
            raise NotFound(f"{rootfs} is not a directory (where is volume {args.name} mounted?)")
    else:
        rootfs = bundle / "rootfs"
        rootfs.mkdir(parents=True, exist_ok=True)
        rc = _mount(store, rootfs, args.name, read_only)
        if rc:
            return rc  # (the launcher said why)
    config = runtime_config(oci, rootfs, args.name, read_only)
    bundle.mkdir(parents=True, exist_ok=True)
    tmp = bundle / ".config.json.tmp"
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(tmp, bundle / "config.json")
    runs = json.dumps(config["process"]["args"])
    print(f"wrote {bundle / 'config.json'}: `runc run -b {bundle} ID` runs {runs}")
    if args.rootfs is None:
        print(
            f"volume {args.name} is mounted at {rootfs}: `casfs umount {rootfs}` when the container is gone"
        )
    return 0


def image_config(repo: Repository, volume: str) -> dict[str, Any]:
    """What the OCI image a volume comes from remembers (through snapshots of volumes)."""
    from casfs.images import get_image
    from casfs.volumes import get_volume

    origin = get_volume(repo, volume).origin
    for _ in range(64):
        kind, _, rest = origin.partition(":")
        if kind == "image":
            oci = get_image(repo, rest).oci
            if oci is None:
                break
            return oci
        if kind != "snapshot":
            break
        origin = get_volume(repo, rest.partition("@")[0]).origin
    raise UsageError(f"volume {volume!r} was not made from an OCI image (its origin: {origin})")


def _mount(store: Path, rootfs: Path, volume: str, read_only: bool) -> int:
    """Mount the volume at rootfs; 0 at once if a daemon of this store serves it there."""
    from casfs.fuse.launcher import mount_main, run_path  # (the client side: no trio, no pyfuse3)
    from casfs.fuse.mountinfo import find_mount

    existing = find_mount(str(rootfs))
    if existing is not None and existing.is_casfs:
        try:
            record = json.loads(run_path(store, str(rootfs)).read_text())
        except (OSError, ValueError):
            record = {}
        if record.get("volume") == volume and record.get("state") == "mounted":
            return 0
        raise Busy(f"{rootfs} is already a casfs mount, not of volume {volume} ({existing.source})")

    ns = argparse.Namespace(
        store_path=store,
        mountpoint=str(rootfs),
        volume=volume,
        ro=read_only,
        allow_other=True,
        suid=True,  # (a container's rootfs: its setuid programs and file capabilities work)
        foreground=False,
    )
    return mount_main(ns, _no_foreground)


def _no_foreground(cfg: object) -> int:
    raise AssertionError("a bundle's mount runs in the background")
