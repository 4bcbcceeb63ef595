"""Parsing and printing the small values users type: names, sizes, VOL@N."""

from __future__ import annotations

import re

from casfs.errors import UsageError
from casfs.ids import SnapshotNo

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


def parse_rate(text: str) -> int:
    """A bandwidth in bytes per second: '50M', '50M/s', '800K', '1G' (binary multiples,
    as sizes and rsync's --bwlimit; a plain number is bytes)."""
    body = text.strip().lower().removesuffix("/s")
    try:
        return parse_size(body)
    except UsageError:
        raise UsageError(
            f"invalid rate {text!r}: bytes per second, a number with an optional K, M or G suffix (e.g. 50M)"
        ) from None


def format_size(n: int) -> str:
    if abs(n) < 1024:
        return f"{n} B"
    scaled = n / 1024
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        if abs(scaled) < 1024 or unit == "TiB":
            return f"{scaled:.1f} {unit}"
        scaled /= 1024
    raise AssertionError


def parse_snapshot_ref(text: str) -> tuple[str, SnapshotNo]:
    """'VOL@N' -> (VOL, N)."""
    vol, sep, n = text.rpartition("@")
    if not sep or not n.isdigit() or int(n) < 1:
        raise UsageError(f"invalid snapshot {text!r}: expected VOLUME@N with N >= 1")
    return check_name(vol, "volume"), SnapshotNo(int(n))


_DURATION = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """'30s', '10m', '2h', '1d', '1w', or plain seconds ('90', '0.5') -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text.lower())
    if not m or float(m.group(1)) <= 0:
        raise UsageError(
            f"invalid duration {text!r}: a positive number with an optional s, m, h, d or w suffix"
        )
    return float(m.group(1)) * _DURATION[m.group(2)]


def format_duration(seconds: float) -> str:
    for unit, n in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n and seconds % n == 0:
            return f"{int(seconds // n)}{unit}"
    return f"{seconds:g}s"
