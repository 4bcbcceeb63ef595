"""`casfs image …`: import, ls, info, rm, export."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from casfs.cli.output import Progress, figure, keyvalues, page, phase, print_json, ratio, table, when
from casfs.cli.store import open_store, store_footer
from casfs.units import format_size, parse_size

if TYPE_CHECKING:
    import argparse
    from typing import Any

    from casfs.images import ImageInfo
    from casfs.repo import Repository


def _doc(repo: Repository, info: ImageInfo) -> dict[str, Any]:
    from casfs.images import image_users
    from casfs.refcount.accounts import image_figures

    return {
        **info.to_json(),
        **image_figures(repo, info.name).to_json(),
        "volumes": image_users(repo.conn, info.name),
    }


def cmd_import(args: argparse.Namespace) -> int:
    from pathlib import Path

    from casfs.images import import_image
    from casfs.importers.oci.reference import is_reference

    chunk_size = None if args.chunk_size is None else parse_size(args.chunk_size)
    source: Path | str = args.source if is_reference(args.source) else Path(args.source)
    stored: list[int] = []
    with open_store(args) as repo:
        progress = None
        if sys.stderr.isatty():
            total = source.stat().st_size if isinstance(source, Path) and source.is_file() else None
            progress = Progress(f"importing {args.name}", total, sys.stderr)
        try:
            info, created = import_image(
                repo,
                args.name,
                source,
                expect=args.expect,
                fmt=args.format,
                chunk_size=chunk_size,
                allow_devices=args.allow_devices,
                progress=progress,
                platform=args.platform,
                on_stored=stored.append,
            )
        finally:
            if progress is not None:
                progress.close()
        if not created:
            print(f"image {info.name} already imported")
            return 0
        (new,) = stored
        shared = ""
        if info.oci is not None and info.oci["layers_reused"]:
            reused, layers = info.oci["layers_reused"], len(info.oci["layers"])
            shared = f", {reused} of {layers} layers shared with a stored image"
        print(
            f"imported image {info.name}: {format_size(info.size)} ({info.kind}), "
            f"stored {format_size(new)} new, digest {info.digest or '-'}{shared}"
        )
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from casfs.images import list_images
    from casfs.refcount.accounts import settle

    after, limit = page(args)
    with open_store(args) as repo:
        infos = list_images(repo, after=after, limit=limit)
        settle(repo, [f"image:{i.name}" for i in infos])
        docs = [_doc(repo, i) for i in infos]
        if args.json:
            print_json(docs)
        else:
            rows = [
                [
                    d["name"],
                    d["kind"],
                    d["phase"],
                    format_size(d["size"]),
                    figure(d, "stored"),
                    figure(d, "unique"),
                    ratio(d["logical"], d["stored"]),
                    ",".join(d["volumes"]) or "-",
                ]
                for d in docs
            ]
            table(
                ["NAME", "KIND", "PHASE", "SIZE", "STORED", "UNIQUE", "RATIO", "VOLUMES"],
                rows,
                right=["SIZE", "STORED", "UNIQUE", "RATIO"],
            )
            store_footer(repo, docs)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from casfs.images import get_image

    with open_store(args) as repo:
        d = _doc(repo, get_image(repo, args.name))
        if args.json:
            print_json(d)
        else:
            keyvalues(
                [
                    ("name", d["name"]),
                    ("kind", d["kind"]),
                    ("phase", phase(d)),
                    ("size", f"{format_size(d['size'])} ({d['size']} bytes)"),
                    ("stored", f"{figure(d, 'stored')} ({d['stored']} bytes)"),
                    ("unique", f"{figure(d, 'unique')} ({d['unique']} bytes, freed by rm + gc)"),
                    ("ratio", f"{ratio(d['logical'], d['stored'])} (logical / stored)"),
                    ("chunk size", format_size(d["chunk_size"])),
                    ("source", d["source"]),
                    ("digest", d["digest"]),
                    ("root", d["root"]),
                    ("created", when(d["created"])),
                    ("volumes", ", ".join(d["volumes"])),
                    ("error", d["error"]),
                    *_oci_lines(d["oci"]),
                ]
            )
    return 0


def _oci_lines(oci: dict[str, Any] | None) -> list[tuple[str, str | None]]:
    """What an OCI image remembers, for `image info`."""
    if oci is None:
        return []
    platform = "/".join(x for x in (oci["os"], oci["architecture"], oci["variant"]) if x)
    return [
        ("manifest", oci["manifest_digest"] or "- (docker-archive)"),
        ("index", oci["index_digest"]),
        ("config", oci["config_digest"]),
        ("platform", platform or None),
        (
            "layers",
            f"{len(oci['layers'])} ({oci['layers_reused']} taken from a stored image's tree at import)",
        ),
        ("entrypoint", json.dumps(oci["entrypoint"])),
        ("cmd", json.dumps(oci["cmd"])),
        ("env", " ".join(oci["env"])),
        ("workdir", oci["workdir"] or "/"),
        ("user", oci["user"] or "0 (root)"),
        *((f"label {k}", v) for k, v in sorted(oci["labels"].items())),
    ]


def cmd_rm(args: argparse.Namespace) -> int:
    from casfs.images import remove_image

    with open_store(args, frees=True) as repo:
        if remove_image(repo, args.name, if_exists=args.if_exists):
            print(f"removed image {args.name} (`casfs gc` frees its unique blobs)")
        else:
            print(f"no image {args.name}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from casfs.images import export_image

    dest = Path(args.dest)
    with open_store(args) as repo:
        fmt = export_image(repo, args.name, dest, args.format)
    print(f"exported image {args.name} to {dest} ({fmt})")
    return 0
