"""The `casfs` command line: nouns then verbs, one line per error, an exit code per kind.

The grammar is a contract (DESIGN.md, "The command line"): scripts and orchestrators
depend on it, and on `--json` output, whose keys only ever grow.

Exit codes come from CasfsError.exit_code: 0 success, 2 bad usage, 3 not found,
4 conflict or busy, 5 corruption, 1 anything else, 130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TextIO

from casfs import __version__
from casfs.errors import CasfsError, NotFound, UsageError
from casfs.units import format_duration, format_size, parse_duration, parse_size, parse_snapshot_ref

Command = Callable[[argparse.Namespace], int]


# -- output helpers ------------------------------------------------------------


def _json_default(o: object) -> Any:
    if isinstance(o, bytes | bytearray | memoryview):
        return bytes(o).hex()
    if isinstance(o, Path):
        return str(o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    raise TypeError(f"cannot encode {type(o).__name__} as JSON")


def _print_json(doc: object) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True, default=_json_default))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[str] = ()) -> None:
    """Aligned columns under a header; columns named in `right` are right-aligned (numbers)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    for line in [header, *rows]:
        cells = [
            c.rjust(w) if h in right else c.ljust(w) for c, w, h in zip(line, widths, header, strict=True)
        ]
        print("  ".join(cells).rstrip())


def _keyvalues(pairs: Sequence[tuple[str, object]]) -> None:
    width = max(len(k) for k, _ in pairs)
    for k, v in pairs:
        print(f"{k + ':':<{width + 1}} {'-' if v is None or v == '' else v}")


def _ratio(logical: int, stored: int) -> str:
    if not stored or not logical:
        return "-"
    r = logical / stored
    return f"{r:.2f}x" if r < 100 else f"{r:.0f}x" if r < 10_000 else ">9999x"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _error(msg: str) -> None:
    """The one line every failure prints."""
    print(f"casfs: error: {' '.join(msg.split())}", file=sys.stderr)


def _warn(msg: str) -> None:
    print(f"casfs: warning: {msg}", file=sys.stderr)


class _Progress:
    """Bytes done and MB/s on one stderr line, redrawn at most 10 times a second."""

    def __init__(self, label: str, total: int | None, stream: TextIO) -> None:
        self.label, self.total, self.stream = label, total, stream
        self.done = 0
        self.start = self.last = time.monotonic()

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if now - self.last >= 0.1:
            self.last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.done / max(now - self.start, 1e-6) / 1e6
        of = ""
        if self.total:
            of = f" / {format_size(self.total)} ({min(100, 100 * self.done // self.total)}%)"
        self.stream.write(f"\r\x1b[K{self.label}: {format_size(self.done)}{of}  {rate:.1f} MB/s")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\r\x1b[K")
        self.stream.flush()


# -- the store -----------------------------------------------------------------


@contextmanager
def _open(args: argparse.Namespace) -> Iterator[Any]:
    """The store, after recovering what dead processes left half done (one stderr line each)."""
    from casfs.lifecycle.recovery import recover
    from casfs.repo import Repository, store_path

    repo = Repository.open(store_path(args.store))
    try:
        for message in recover(repo):
            print(f"casfs: recovered: {message}", file=sys.stderr)
        yield repo
    finally:
        repo.close()


def cmd_init(args: argparse.Namespace) -> int:
    from casfs.repo import Repository, store_path

    path = store_path(args.store)
    existed = (path / "catalog.db").exists()
    Repository.init(path).close()
    print(f"casfs store at {path} {'already exists' if existed else 'created'}")
    return 0


# -- images --------------------------------------------------------------------


def _image_doc(repo: Any, info: Any) -> dict[str, Any]:
    from casfs.images import image_users
    from casfs.refcount.usage import image_roots, usage

    u = usage(repo, image_roots(repo.conn, info.name))
    return {
        **info.to_json(),
        "logical": u.logical,
        "stored": u.stored,
        "unique": u.unique,
        "ratio": round(u.ratio, 3),
        "volumes": image_users(repo.conn, info.name),
        "unreadable_blobs": u.unreadable,
    }


def _phase(d: dict[str, Any]) -> str:
    """A phase, with the process holding it ("mounted by process 123")."""
    pid = d.get("owner_pid")
    return f"{d['phase']} by process {pid}" if pid else str(d["phase"])


def _check_unreadable(docs: Sequence[dict[str, Any]]) -> None:
    bad = sum(d["unreadable_blobs"] for d in docs)
    if bad:
        _warn(f"{bad} metadata blob(s) could not be read, sizes are lower bounds: run `casfs fsck`")


def cmd_image_import(args: argparse.Namespace) -> int:
    from casfs.images import import_image
    from casfs.refcount.usage import image_roots, usage

    chunk_size = parse_size(args.chunk_size)
    source = Path(args.source)
    with _open(args) as repo:
        progress = None
        if sys.stderr.isatty():
            total = source.stat().st_size if source.is_file() else None
            progress = _Progress(f"importing {args.name}", total, sys.stderr)
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
            )
        finally:
            if progress is not None:
                progress.close()
        if not created:
            print(f"image {info.name} already imported")
            return 0
        new = usage(repo, image_roots(repo.conn, info.name)).unique
        print(
            f"imported image {info.name}: {format_size(info.size)} ({info.kind}), "
            f"stored {format_size(new)} new, digest {info.digest or '-'}"
        )
    return 0


def cmd_image_ls(args: argparse.Namespace) -> int:
    from casfs.images import list_images

    with _open(args) as repo:
        docs = [_image_doc(repo, i) for i in list_images(repo)]
        if args.json:
            _print_json(docs)
        else:
            rows = [
                [
                    d["name"],
                    d["kind"],
                    d["phase"],
                    format_size(d["size"]),
                    format_size(d["stored"]),
                    format_size(d["unique"]),
                    _ratio(d["logical"], d["stored"]),
                    ",".join(d["volumes"]) or "-",
                ]
                for d in docs
            ]
            _table(
                ["NAME", "KIND", "PHASE", "SIZE", "STORED", "UNIQUE", "RATIO", "VOLUMES"],
                rows,
                right=["SIZE", "STORED", "UNIQUE", "RATIO"],
            )
            _store_footer(repo)
        _check_unreadable(docs)
    return 0


def cmd_image_info(args: argparse.Namespace) -> int:
    from casfs.images import get_image

    with _open(args) as repo:
        d = _image_doc(repo, get_image(repo, args.name))
        if args.json:
            _print_json(d)
        else:
            _keyvalues(
                [
                    ("name", d["name"]),
                    ("kind", d["kind"]),
                    ("phase", _phase(d)),
                    ("size", f"{format_size(d['size'])} ({d['size']} bytes)"),
                    ("stored", f"{format_size(d['stored'])} ({d['stored']} bytes)"),
                    ("unique", f"{format_size(d['unique'])} ({d['unique']} bytes, freed by rm + gc)"),
                    ("ratio", f"{_ratio(d['logical'], d['stored'])} (logical / stored)"),
                    ("chunk size", format_size(d["chunk_size"])),
                    ("source", d["source"]),
                    ("digest", d["digest"]),
                    ("root", d["root"]),
                    ("created", _when(d["created"])),
                    ("volumes", ", ".join(d["volumes"])),
                    ("error", d["error"]),
                ]
            )
        _check_unreadable([d])
    return 0


def cmd_image_rm(args: argparse.Namespace) -> int:
    from casfs.images import remove_image

    with _open(args) as repo:
        if remove_image(repo, args.name, if_exists=args.if_exists):
            print(f"removed image {args.name} (`casfs gc` frees its unique blobs)")
        else:
            print(f"no image {args.name}")
    return 0


def _check_dest(dest: Path) -> None:
    from casfs.errors import Conflict

    if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())):
        raise Conflict(f"{dest} already exists")


def cmd_image_export(args: argparse.Namespace) -> int:
    from casfs.images import export_image

    dest = Path(args.dest)
    with _open(args) as repo:
        fmt = export_image(repo, args.name, dest, args.format)
    print(f"exported image {args.name} to {dest} ({fmt})")
    return 0


# -- volumes -------------------------------------------------------------------


def _volume_doc(repo: Any, info: Any) -> dict[str, Any]:
    from casfs.refcount.usage import usage, volume_roots

    u = usage(repo, volume_roots(repo.conn, info.name))
    return {
        **info.to_json(),
        "logical": u.logical,
        "stored": u.stored,
        "unique": u.unique,
        "ratio": round(u.ratio, 3),
        "unreadable_blobs": u.unreadable,
    }


def cmd_volume_create(args: argparse.Namespace) -> int:
    from casfs.volumes import Source, create_volume

    if args.source is not None:
        source = Source(snapshot=args.source) if "@" in args.source else Source(image=args.source)
    elif args.blank_dir:
        source = Source(blank_dir=True)
    else:
        source = Source(blank_block=parse_size(args.blank_block))
    grace = parse_duration(args.grace) if args.grace is not None else None
    with _open(args) as repo:
        info, created = create_volume(repo, args.name, source, read_only=args.ro, grace_s=grace)
    if created:
        print(
            f"created volume {info.name} ({info.kind}, {info.mode}, {format_size(info.size)}) "
            f"from {info.origin}"
        )
    else:
        print(f"volume {info.name} already exists with the same spec")
    return 0


def cmd_volume_ls(args: argparse.Namespace) -> int:
    from casfs.volumes import list_volumes

    with _open(args) as repo:
        docs = [_volume_doc(repo, v) for v in list_volumes(repo)]
        if args.json:
            _print_json(docs)
        else:
            rows = [
                [
                    d["name"],
                    d["kind"],
                    d["mode"],
                    d["phase"],
                    str(d["owner_pid"] or "-"),
                    format_size(d["size"]),
                    format_size(d["stored"]),
                    format_size(d["unique"]),
                    _ratio(d["logical"], d["stored"]),
                    d["origin"],
                    str(len(d["snapshots"])),
                ]
                for d in docs
            ]
            _table(
                [
                    "NAME",
                    "KIND",
                    "MODE",
                    "PHASE",
                    "PID",
                    "SIZE",
                    "STORED",
                    "UNIQUE",
                    "RATIO",
                    "ORIGIN",
                    "SNAPSHOTS",
                ],
                rows,
                right=["SIZE", "STORED", "UNIQUE", "RATIO", "SNAPSHOTS"],
            )
            _store_footer(repo)
        _check_unreadable(docs)
    return 0


def cmd_volume_info(args: argparse.Namespace) -> int:
    from casfs import volumes
    from casfs.volumes import get_volume

    with _open(args) as repo:
        d = _volume_doc(repo, get_volume(repo, args.name))
        if args.json:
            _print_json(d)
        else:
            _keyvalues(
                [
                    ("name", d["name"]),
                    ("kind", d["kind"]),
                    ("mode", d["mode"]),
                    ("phase", _phase(d)),
                    ("origin", d["origin"]),
                    ("size", f"{format_size(d['size'])} ({d['size']} bytes)"),
                    ("logical", f"{format_size(d['logical'])} (the volume and its snapshots)"),
                    ("stored", f"{format_size(d['stored'])} ({d['stored']} bytes)"),
                    ("unique", f"{format_size(d['unique'])} ({d['unique']} bytes, freed by rm + gc)"),
                    ("ratio", f"{_ratio(d['logical'], d['stored'])} (logical / stored)"),
                    ("chunk size", format_size(d["chunk_size"])),
                    ("base", d["base"]),
                    ("created", _when(d["created"])),
                    ("last used", _when(d["last_used"]) if d["last_used"] else None),
                    ("grace", _grace(d)),
                    ("snapshots", ", ".join(map(str, d["snapshots"]))),
                    ("NOT SAVED", volumes.describe_unsaved(d["unsaved"]) if d["unsaved"] else None),
                ]
            )
        _check_unreadable([d])
    return 0


def _grace(d: dict[str, Any]) -> str | None:
    if d["grace_s"] is None:
        return None
    since = d["last_used"] or d["created"]
    left = since + d["grace_s"] - time.time()
    when = (
        f"removed by gc in {format_duration(round(left))}" if left > 0 else "expired: the next gc removes it"
    )
    return f"{format_duration(d['grace_s'])} (ephemeral; {when})"


def cmd_volume_rm(args: argparse.Namespace) -> int:
    from casfs.volumes import remove_volume

    with _open(args) as repo:
        if remove_volume(repo, args.name, if_exists=args.if_exists):
            print(f"removed volume {args.name} and its snapshots (`casfs gc` frees their unique blobs)")
        else:
            print(f"no volume {args.name}")
    return 0


def cmd_volume_resize(args: argparse.Namespace) -> int:
    from casfs.units import format_size, parse_size
    from casfs.volumes import resize

    size = parse_size(args.size)
    with _open(args) as repo:
        old = resize(repo, args.name, size, allow_shrink=args.allow_shrink)
    print(f"resized volume {args.name}: {format_size(old)} -> {format_size(size)}")
    return 0


def cmd_volume_export(args: argparse.Namespace) -> int:
    from casfs.images import export_root
    from casfs.store.ids import BlobId
    from casfs.volumes import get_volume

    dest = Path(args.dest)
    with _open(args) as repo:
        v = get_volume(repo, args.name)
        if v.phase == "mounted" and v.mode == "rw":
            _warn(f"volume {v.name} is mounted read/write: exporting its last folded state (its base)")
        else:
            from casfs.volumes import settle

            if settle(repo, v.name) is not None:  # a crashed mount's changes: fold, don't drop
                v = get_volume(repo, args.name)
        _check_dest(dest)
        fmt = export_root(repo, v.kind, BlobId(bytes.fromhex(v.base)), v.chunk_size, dest, args.format)
    print(f"exported volume {args.name} to {dest} ({fmt})")
    return 0


# -- snapshots -----------------------------------------------------------------


def cmd_snapshot_create(args: argparse.Namespace) -> int:
    from casfs.volumes import create_snapshot

    with _open(args) as repo:
        n = create_snapshot(repo, args.volume, label=args.label)
    print(n)
    return 0


def cmd_snapshot_ls(args: argparse.Namespace) -> int:
    from casfs.refcount.usage import Root, usage
    from casfs.store.ids import BlobId
    from casfs.volumes import list_snapshots

    with _open(args) as repo:
        docs = []
        for s in list_snapshots(repo, args.volume):
            u = usage(repo, [Root(BlobId(bytes.fromhex(s.root)), s.size)])
            docs.append(
                {**s.to_json(), "stored": u.stored, "unique": u.unique, "unreadable_blobs": u.unreadable}
            )
        if args.json:
            _print_json(docs)
        else:
            rows = [
                [
                    f"{d['volume']}@{d['n']}",
                    format_size(d["size"]),
                    format_size(d["stored"]),
                    format_size(d["unique"]),
                    _when(d["created"]),
                    d["label"] or "-",
                ]
                for d in docs
            ]
            _table(
                ["SNAPSHOT", "SIZE", "STORED", "UNIQUE", "CREATED", "LABEL"],
                rows,
                right=["SIZE", "STORED", "UNIQUE"],
            )
        _check_unreadable(docs)
    return 0


def cmd_snapshot_rm(args: argparse.Namespace) -> int:
    from casfs.volumes import remove_snapshot

    with _open(args) as repo:
        if remove_snapshot(repo, args.ref, if_exists=args.if_exists):
            print(f"removed snapshot {args.ref}")
        else:
            print(f"no snapshot {args.ref}")
    return 0


def cmd_snapshot_export(args: argparse.Namespace) -> int:
    from casfs.images import export_root
    from casfs.store.ids import BlobId

    volume, n = parse_snapshot_ref(args.ref)
    dest = Path(args.dest)
    with _open(args) as repo:
        row = repo.conn.execute(
            "SELECT s.root, v.kind, v.chunk_size FROM snapshots s JOIN volumes v ON v.name = s.volume "
            "WHERE s.volume = ? AND s.n = ?",
            (volume, n),
        ).fetchone()
        if row is None:
            raise NotFound(f"no snapshot {volume}@{n}")
        _check_dest(dest)
        fmt = export_root(repo, row[1], BlobId(bytes(row[0])), row[2], dest, args.format)
    print(f"exported snapshot {volume}@{n} to {dest} ({fmt})")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from casfs.volumes import rollback

    n = _positive_int(args.n, "snapshot number")
    with _open(args) as repo:
        rollback(repo, args.volume, n)
    print(f"rolled volume {args.volume} back to snapshot {n}")
    return 0


def _positive_int(text: str, what: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"invalid {what} {text!r}: expected an integer >= 1")
    return int(text)


# -- maintenance ---------------------------------------------------------------


def _store_footer(repo: Any) -> None:
    from casfs.refcount.usage import store_usage

    s = store_usage(repo)
    garbage = f", {format_size(s.garbage)} garbage (`casfs gc`)" if s.garbage else ""
    print(
        f"\nstore: {_count(s.images, 'image')}, {_count(s.volumes, 'volume')}, "
        f"{_count(s.snapshots, 'snapshot')}; "
        f"logical {format_size(s.logical)}, stored {format_size(s.stored)} in {s.blobs} blobs "
        f"({_ratio(s.logical, s.stored)}){garbage}"
    )


def cmd_fsck(args: argparse.Namespace) -> int:
    from casfs.lifecycle.queue import job_slot
    from casfs.refcount.fsck import fsck

    sample = _fraction(args.sample)
    with _open(args) as repo, job_slot(repo, "fsck --repair" if args.repair else "fsck"):
        report = fsck(repo, repair=args.repair, sample=sample)
    remaining = [p for p in report.problems if not p.repaired]
    if args.json:
        _print_json({**dataclasses.asdict(report), "clean": report.clean, "remaining": len(remaining)})
    else:
        for p in report.problems:
            print(f"{p.kind:<10} {p.blob}  {p.message}{'  [repaired]' if p.repaired else ''}")
        print(
            f"checked {report.rows} blob rows, re-hashed {report.blobs_checked} blobs "
            f"({format_size(report.bytes_checked)}); {len(report.problems)} problem(s), "
            f"{len(report.problems) - len(remaining)} repaired"
        )
    if remaining:
        how = "" if args.repair else "; `casfs fsck --repair` fixes counts and orphans"
        _error(f"{len(remaining)} problem(s) found in the store{how}")
        return 5
    return 0


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise UsageError(f"invalid sample {text!r}: a fraction in (0, 1]")
    return value


def cmd_gc(args: argparse.Namespace) -> int:
    from casfs.lifecycle.ephemeral import expire
    from casfs.lifecycle.queue import job_slot
    from casfs.refcount.gc import gc

    kept: list[str] = []
    with _open(args) as repo, job_slot(repo, "gc"):
        expired = expire(repo, kept=kept)  # first: what they held is freed by this gc
        report = gc(repo)
    for why in kept:
        _warn(f"ephemeral volume {why}: kept")
    if args.json:
        _print_json({**dataclasses.asdict(report), "expired_volumes": expired})
    else:
        for name in expired:
            print(f"removed ephemeral volume {name}: unused for longer than its grace period")
        print(
            f"freed {report.blobs_freed} blobs and {report.orphan_files_removed} orphan files: "
            f"{format_size(report.bytes_freed)}"
        )
    for p in report.problems:
        _warn(f"{p} (run `casfs fsck`)")
    return 0


def cmd_queue_ls(args: argparse.Namespace) -> int:
    from casfs.lifecycle.queue import status

    with _open(args) as repo:
        st = status(repo)
    if args.json:
        _print_json(st.to_json())
        return 0
    now = time.time()
    rows = [
        [
            "-" if j.slot is None else str(j.slot),
            "waiting" if j.slot is None else "running",
            str(j.pid),
            f"{now - j.since:.1f}s",
            j.what,
        ]
        for j in [*st.running, *st.waiting]
    ]
    _table(["SLOT", "STATE", "PID", "FOR", "JOB"], rows, right=["FOR"])
    print(f"\n{len(st.running)} running, {len(st.waiting)} waiting, limit {st.limit}")
    return 0


def cmd_config_get(args: argparse.Namespace) -> int:
    from casfs.lifecycle import config

    with _open(args) as repo:
        v = config.effective(repo.conn, args.key)
    if args.json:
        _print_json(v)
    else:
        print(v.value)
    return 0


def cmd_config_set(args: argparse.Namespace) -> int:
    from casfs.lifecycle import config

    with _open(args) as repo:
        value = config.set_value(repo.conn, args.key, args.value)
        v = config.effective(repo.conn, args.key)
    print(f"{args.key} = {value}")
    if v.source.startswith("env:"):
        _warn(f"${v.source[4:]} overrides it in this environment ({v.value})")
    return 0


def cmd_config_unset(args: argparse.Namespace) -> int:
    from casfs.lifecycle import config

    with _open(args) as repo:
        config.unset_value(repo.conn, args.key)
        v = config.effective(repo.conn, args.key)
    print(f"{args.key} = {v.value} ({v.source})")
    return 0


def cmd_config_ls(args: argparse.Namespace) -> int:
    from casfs.lifecycle import config

    with _open(args) as repo:
        values = [config.effective(repo.conn, key) for key in sorted(config.SETTINGS)]
    if args.json:
        _print_json(values)
    else:
        _table(
            ["KEY", "VALUE", "FROM", "MEANING"],
            [[v.key, v.value, v.source, config.SETTINGS[v.key].help] for v in values],
        )
    return 0


def _daemon(entry: str) -> Command:
    def run(args: argparse.Namespace) -> int:
        from casfs.repo import store_path

        daemon = importlib.import_module("casfs.fuse.daemon")  # (trio and pyfuse3: only to mount)
        if entry == "mount_main":
            args.store_path = store_path(args.store)
        return int(getattr(daemon, entry)(args))

    return run


# -- the parser ----------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in the one-line form every casfs error takes."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"casfs: error: {message} (see `{self.prog} --help`)\n")


def _common() -> _Parser:
    # SUPPRESS: given after the command, they override; absent, they keep the global value.
    p = _Parser(add_help=False)
    p.add_argument(
        "-s", "--store", metavar="PATH", default=argparse.SUPPRESS, help="the store (default: $CASFS_STORE)"
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show tracebacks of unexpected errors",
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = _Parser(
        prog="casfs",
        description="casfs: a content-addressed filesystem for virtual machines and containers.",
        epilog="Exit codes: 0 ok, 1 failure, 2 bad usage, 3 not found, 4 conflict or busy, 5 corruption.",
    )
    parser.add_argument(
        "-s", "--store", metavar="PATH", default=None, help="the store (default: $CASFS_STORE)"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=False, help="show tracebacks of unexpected errors"
    )
    parser.add_argument("--version", action="version", version=f"casfs {__version__}")
    nouns = parser.add_subparsers(dest="noun", metavar="COMMAND", required=True)

    def add(
        sub: Any, name: str, func: Command, help: str, description: str | None = None
    ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name,
            help=help,
            description=description or help,
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(func=func)
        return p

    def group(name: str, help: str) -> Any:
        p = nouns.add_parser(name, help=help, description=help, parents=[common])
        return p.add_subparsers(dest="verb", metavar="VERB", required=True)

    add(nouns, "init", cmd_init, "create a store at --store (an existing store is left as it is)")

    # image
    images = group("image", "immutable, verified content: raw disk images and directory trees")
    p = add(
        images,
        "import",
        cmd_image_import,
        "import a raw disk image, a directory or a tar archive",
        "Import SOURCE as image NAME. Nothing is stored unless all of it was read and, with\n"
        "--expect, its digest matched. Repeating an identical import succeeds and does nothing.",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "source", metavar="SOURCE", help="a raw file, a directory, or a tar (.tar, .tar.gz, .tar.zst)"
    )
    p.add_argument("--expect", metavar="ALGO:HEX", help="sha256:HEX or blake3:HEX the source must match")
    p.add_argument(
        "--format",
        choices=("auto", "raw", "tar", "dir"),
        default="auto",
        help="how to read SOURCE (default: detected)",
    )
    p.add_argument(
        "--chunk-size",
        metavar="SIZE",
        default="64K",
        help="chunk size, a power of two from 4K to 4M (default: 64K)",
    )
    p.add_argument("--allow-devices", action="store_true", help="keep device nodes found in a tar archive")
    p = add(images, "ls", cmd_image_ls, "list images with their logical, stored and unique bytes")
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p = add(images, "info", cmd_image_info, "show one image")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p = add(
        images,
        "rm",
        cmd_image_rm,
        "delete an image (refused while a volume was made from it)",
        "Delete an image. Its blobs are freed by the next `casfs gc`, unless shared.",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--if-exists", action="store_true", help="succeed when there is no such image")
    p = add(images, "export", cmd_image_export, "write an image out: a raw file, a directory or a tar")
    p.add_argument("name", metavar="NAME")
    p.add_argument("dest", metavar="DEST", help="must not exist (or be an empty directory)")
    p.add_argument(
        "--format",
        choices=("auto", "raw", "dir", "tar"),
        default="auto",
        help="default: raw for block images; tar when DEST ends in .tar…, else dir",
    )

    # volume
    volumes = group("volume", "named, mountable, copy-on-write volumes")
    p = add(
        volumes,
        "create",
        cmd_volume_create,
        "create a volume from an image, a snapshot or blank space",
        "Create volume NAME. A clone of an image or a snapshot costs the same whatever its size.\n"
        "Repeating an identical create succeeds; a different spec for an existing name exits 4.",
    )
    p.add_argument("name", metavar="NAME")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--from", dest="source", metavar="IMAGE|VOL@N", help="an image, or snapshot N of volume VOL"
    )
    src.add_argument("--blank-dir", action="store_true", help="an empty directory volume")
    src.add_argument("--blank-block", metavar="SIZE", help="a block volume of SIZE zero bytes (e.g. 10G)")
    p.add_argument("--ro", action="store_true", help="read-only")
    p.add_argument(
        "--grace",
        metavar="DURATION",
        help="ephemeral: `casfs gc` removes the volume once it has not been mounted for this long "
        "(e.g. 30s, 10m, 2h, 7d)",
    )
    p = add(volumes, "ls", cmd_volume_ls, "list volumes with their logical, stored and unique bytes")
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p = add(volumes, "info", cmd_volume_info, "show one volume")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p = add(
        volumes,
        "rm",
        cmd_volume_rm,
        "delete a volume and its snapshots",
        "Delete a volume and its snapshots (refused while mounted, or while another volume\n"
        "was made from one of its snapshots). Blobs are freed by the next `casfs gc`.",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--if-exists", action="store_true", help="succeed when there is no such volume")
    p = add(
        volumes,
        "resize",
        cmd_volume_resize,
        "set a block volume's size (not while mounted read/write)",
        "Grow a block volume (the new space reads as zeros) or, with --allow-shrink, cut it.\n"
        "A write never resizes a block volume: this is the only way.",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("size", metavar="SIZE", help="the new size, e.g. 20G")
    p.add_argument("--allow-shrink", action="store_true", help="allow dropping the end of the disk")
    p = add(
        volumes,
        "export",
        cmd_volume_export,
        "write a volume's base out: a raw file, a directory or a tar",
        "Write out the volume's base: its state at the last snapshot or unmount (changes\n"
        "not yet folded by a mounted read/write daemon are not included).",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("dest", metavar="DEST", help="must not exist (or be an empty directory)")
    p.add_argument("--format", choices=("auto", "raw", "dir", "tar"), default="auto")

    # snapshot
    snaps = group("snapshot", "immutable, numbered states of a volume")
    p = add(snaps, "create", cmd_snapshot_create, "snapshot a volume at rest; prints the snapshot's number")
    p.add_argument("volume", metavar="VOL")
    p.add_argument("--label", metavar="L", help="a free-form label")
    p = add(snaps, "ls", cmd_snapshot_ls, "list a volume's snapshots")
    p.add_argument("volume", metavar="VOL")
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p = add(snaps, "rm", cmd_snapshot_rm, "delete snapshot N of volume VOL (refused while a volume uses it)")
    p.add_argument("ref", metavar="VOL@N")
    p.add_argument("--if-exists", action="store_true", help="succeed when there is no such snapshot")
    p = add(snaps, "export", cmd_snapshot_export, "write a snapshot out: a raw file, a directory or a tar")
    p.add_argument("ref", metavar="VOL@N")
    p.add_argument("dest", metavar="DEST", help="must not exist (or be an empty directory)")
    p.add_argument("--format", choices=("auto", "raw", "dir", "tar"), default="auto")

    p = add(
        nouns,
        "rollback",
        cmd_rollback,
        "make snapshot N the current state of volume VOL",
        "Make snapshot N the volume's state again (the volume must not be mounted read/write).\n"
        "Later snapshots are kept.",
    )
    p.add_argument("volume", metavar="VOL")
    p.add_argument("n", metavar="N")

    p = add(
        nouns,
        "mount",
        _daemon("mount_main"),
        "mount the store, or one volume, with FUSE",
        "Mount the whole store (images/, volumes/, snapshots/) at MOUNTPOINT, or with --volume\n"
        "one volume: its root directory, or a regular file for a block volume.",
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--volume", metavar="NAME", help="mount this volume alone")
    p.add_argument("--ro", action="store_true", help="mount read-only")
    p.add_argument("--allow-other", action="store_true", help="let other users access the mount")
    p.add_argument("--foreground", action="store_true", help="stay in the foreground")
    p = add(nouns, "umount", _daemon("umount_main"), "unmount a casfs mount")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")

    p = add(
        nouns,
        "fsck",
        cmd_fsck,
        "recount references and re-hash blobs; exit 5 if problems remain",
        "Walk every root, recount every reference and re-hash blobs. Exits 0 when clean (or\n"
        "everything found was repaired), 5 when problems remain.",
    )
    p.add_argument("--repair", action="store_true", help="fix counts, remove orphans and dead rows")
    p.add_argument(
        "--sample",
        metavar="FRACTION",
        default="1.0",
        help="re-hash this fraction of data blobs (default 1.0: all); metadata is always read",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p = add(
        nouns,
        "gc",
        cmd_gc,
        "free blobs nothing references any more",
        "Remove ephemeral volumes unused for longer than their grace period, then free every\n"
        "blob nothing references any more.",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")

    queue = group("queue", "the store's bounded work queue (imports, snapshot folds, fsck, gc)")
    p = add(queue, "ls", cmd_queue_ls, "list running and waiting jobs of every process on the store")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    conf = group("config", "store settings, kept in the catalog")
    p = add(conf, "ls", cmd_config_ls, "list settings with their values and where each comes from")
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p = add(conf, "get", cmd_config_get, "print a setting's value (the environment overrides the store)")
    p.add_argument("key", metavar="KEY", help="e.g. queue.limit")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p = add(conf, "set", cmd_config_set, "store a setting, e.g. `casfs config set queue.limit 4`")
    p.add_argument("key", metavar="KEY")
    p.add_argument("value", metavar="VALUE")
    p = add(conf, "unset", cmd_config_unset, "forget a stored setting (back to its default)")
    p.add_argument("key", metavar="KEY")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    verbose = bool(args.verbose)
    try:
        return int(args.func(args))
    except CasfsError as e:
        if verbose:
            traceback.print_exc()
        _error(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        print("casfs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`casfs image ls | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        if verbose:
            traceback.print_exc()
        where = f": {e.filename}" if e.filename else ""
        _error(f"{e.strerror or e}{where}")
        return 1
    except Exception as e:
        if verbose:
            traceback.print_exc()
        _error(f"unexpected {type(e).__name__}: {e} (rerun with -v for the traceback)")
        return 1
