"""Parsing and printing the small values users type: names, sizes, VOL@N."""

from __future__ import annotations

import re

from casfs.errors import UsageError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def check_name(name: str, what: str) -> str:
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"invalid {what} name {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kmgtp]?)(i?b?)\s*", text.lower())
    if not m:
        raise UsageError(f"invalid size {text!r}: use a number with an optional K, M, G or T suffix")
    size = int(m.group(1)) * _SUFFIX[m.group(2)]
    if size <= 0:
        raise UsageError(f"invalid size {text!r}: must be positive")
    return size


def format_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    raise AssertionError


def parse_snapshot_ref(text: str) -> tuple[str, int]:
    """'VOL@N' -> (VOL, N)."""
    vol, sep, n = text.rpartition("@")
    if not sep or not n.isdigit() or int(n) < 1:
        raise UsageError(f"invalid snapshot {text!r}: expected VOLUME@N with N >= 1")
    return check_name(vol, "volume"), int(n)
