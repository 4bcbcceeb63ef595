"""Store settings (`casfs config`), kept in the catalog's meta table.

Each setting has a default and may be overridden for one process by an environment
variable; `effective()` says which of the three gave the value.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from casfs.catalog import meta_value, set_meta, transaction
from casfs.errors import UsageError
from casfs.store.reserve import DEFAULT_BYTES


def _positive_int(key: str, text: str) -> str:
    if not text.strip().isdigit() or int(text) < 1:
        raise UsageError(f"invalid {key} {text!r}: expected an integer >= 1")
    return str(int(text))


def _size(key: str, text: str) -> str:
    from casfs.units import parse_size

    try:
        return str(parse_size(text))
    except UsageError:
        raise UsageError(f"invalid {key} {text!r}: expected a size (e.g. 1G)") from None


def _size_or_zero(key: str, text: str) -> str:
    from casfs.units import parse_size

    try:
        return "0" if text.strip() == "0" else str(parse_size(text))
    except UsageError:
        raise UsageError(f"invalid {key} {text!r}: expected a size (e.g. 16M) or 0") from None


@dataclass(frozen=True)
class Setting:
    key: str
    default: str
    env: str
    help: str
    check: Callable[[str, str], str]  # (key, text) -> normalized value, or UsageError


def _duration_or_off(key: str, text: str) -> str:
    from casfs.units import format_duration, parse_duration

    if text.strip().lower() in ("off", "0", ""):
        return "off"
    try:
        return format_duration(parse_duration(text))
    except UsageError:
        raise UsageError(f"invalid {key} {text!r}: a duration (30m, 12h, 7d) or off") from None


def _size_or_off(key: str, text: str) -> str:
    from casfs.units import parse_size

    if text.strip().lower() in ("off", "0", ""):
        return "off"
    try:
        parse_size(text)
    except UsageError:
        raise UsageError(f"invalid {key} {text!r}: a size a second (100M) or off") from None
    return text.strip()


SETTINGS = {
    s.key: s
    for s in [
        Setting(
            "queue.limit",
            "2",
            "CASFS_QUEUE_LIMIT",
            "heavy jobs (imports, snapshot folds, fsck, gc) running at once on this store",
            _positive_int,
        ),
        Setting(
            "store.reserve",
            str(DEFAULT_BYTES),
            "CASFS_STORE_RESERVE",
            "room kept on the store's disk (STORE/reserve) for rm and gc to work on a full disk; 0: none",
            _size_or_zero,
        ),
        Setting(
            "import.layer_entries",
            "500000",
            "CASFS_IMPORT_LAYER_ENTRIES",
            "entries one image layer may hold; an import of a larger one is refused",
            _positive_int,
        ),
        Setting(
            "import.layer_memory",
            str(1 << 30),
            "CASFS_IMPORT_LAYER_MEMORY",
            "memory applying one image layer may take; an import of a larger one is refused",
            _size,
        ),
        Setting(
            "scrub.every",
            "off",
            "CASFS_SCRUB_EVERY",
            "how often a mount daemon of this store scrubs it (7d, 12h; off: never)",
            _duration_or_off,
        ),
        Setting(
            "scrub.rate",
            "100M",
            "CASFS_SCRUB_RATE",
            "what a scheduled scrub reads a second at most (off: no limit)",
            _size_or_off,
        ),
    ]
}


@dataclass(frozen=True)
class Value:
    key: str
    value: str
    source: str  # 'default', 'store' or 'env:NAME'


def _setting(key: str) -> Setting:
    try:
        return SETTINGS[key]
    except KeyError:
        raise UsageError(f"no setting {key!r}: known settings are {', '.join(sorted(SETTINGS))}") from None


def effective(conn: sqlite3.Connection, key: str) -> Value:
    s = _setting(key)
    env = os.environ.get(s.env)
    if env is not None and env.strip():
        return Value(key, s.check(f"${s.env}", env), f"env:{s.env}")
    value = meta_value(conn, key)
    if value is not None:
        return Value(key, value, "store")
    return Value(key, s.default, "default")


def set_value(conn: sqlite3.Connection, key: str, text: str) -> str:
    value = _setting(key).check(key, text)
    with transaction(conn):
        set_meta(conn, key, value)
    return value


def unset_value(conn: sqlite3.Connection, key: str) -> None:
    _setting(key)
    with transaction(conn):
        set_meta(conn, key, None)
