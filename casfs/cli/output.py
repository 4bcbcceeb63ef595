"""How the CLI prints: tables, JSON, key-value blocks, a progress line, and the one-line
error and warning forms. Presenters format what the library computed; they compute
nothing themselves.

Only the standard library's cheapest modules at import: `json` and `dataclasses` are
imported where they are used, so `casfs --version` and `--help` do not pay for them.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from casfs.units import format_size

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TextIO


def _json_default(o: object) -> object:
    import dataclasses
    from pathlib import Path

    if isinstance(o, bytes | bytearray | memoryview):
        return bytes(o).hex()
    if isinstance(o, Path):
        return str(o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    raise TypeError(f"cannot encode {type(o).__name__} as JSON")


def print_json(doc: object) -> None:
    import json

    print(json.dumps(doc, indent=2, sort_keys=True, default=_json_default))


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[str] = ()) -> None:
    """Aligned columns under a header; columns named in `right` are right-aligned (numbers)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    for line in [header, *rows]:
        cells = [
            c.rjust(w) if h in right else c.ljust(w) for c, w, h in zip(line, widths, header, strict=True)
        ]
        print("  ".join(cells).rstrip())


def keyvalues(pairs: Sequence[tuple[str, object]]) -> None:
    width = max(len(k) for k, _ in pairs)
    for k, v in pairs:
        print(f"{k + ':':<{width + 1}} {'-' if v is None or v == '' else v}")


def ratio(logical: int, stored: int) -> str:
    if not stored or not logical:
        return "-"
    r = logical / stored
    return f"{r:.2f}x" if r < 100 else f"{r:.0f}x" if r < 10_000 else ">9999x"


def figure(d: dict[str, Any], key: str) -> str:
    """A size from a figures document: marked ~ while it is an estimate (pending)."""
    return ("~" if key in d.get("pending", ()) else "") + format_size(d[key])


def page(args: Any, numbered: bool = False) -> tuple[str | None, int | None]:
    """--after and --limit of a listing: (cursor, limit). A cursor need not exist (a
    paging loop goes on past a name removed meanwhile), but it must be a name (or, for
    snapshots, a number) that could exist."""
    from casfs.errors import UsageError
    from casfs.units import check_name

    limit = args.limit
    if limit is not None and (not limit.isdigit() or int(limit) < 1):
        raise UsageError(f"invalid --limit {limit!r}: expected an integer >= 1")
    after = args.after
    if after is not None and numbered and not after.isdigit():
        raise UsageError(f"invalid --after {after!r}: expected a snapshot number")
    if after is not None and not numbered:
        check_name(after, "--after")
    return after, None if limit is None else int(limit)


def count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def phase(d: dict[str, Any]) -> str:
    """A phase, with the process holding it ("mounted by process 123")."""
    pid = d.get("owner_pid")
    return f"{d['phase']} by process {pid}" if pid else str(d["phase"])


def error(msg: str) -> None:
    """The one line every failure prints."""
    print(f"casfs: error: {' '.join(msg.split())}", file=sys.stderr)


def warn(msg: str) -> None:
    print(f"casfs: warning: {msg}", file=sys.stderr)


class Progress:
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
