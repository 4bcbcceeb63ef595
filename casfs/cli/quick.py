"""Plain command lines, parsed from the grammar without argparse.

Nearly every call is plain: the command's words, each option by its exact flag with
its value as the next word, the positionals in order. argparse would cost such a call
a third of a clone's start-up (importing it, gettext and locale; making the parsers,
each of which looks up translations). parse() returns what argparse returns for such a
line (tests/unit/test_cli_quick.py compares the two over the grammar), and None for
anything else: --help, --version, `--flag=value`, an abbreviated or unknown option, a
value starting with '-', a missing or extra word, a value not among its choices.
argparse then takes the line, and says what is wrong with it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

from casfs.cli.grammar import GRAMMAR, Arg, OneOf

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from casfs.cli.grammar import Row

# The options every level takes (the top parser's, and its `common` parent's).
STORE = ("-s", "--store")
VERBOSE = ("-v", "--verbose")


def parse(argv: Sequence[str]) -> SimpleNamespace | None:
    values: dict[str, object] = {"store": None, "verbose": False}
    words = iter(argv)
    found = _command(words, values)
    if found is None:
        return None
    row, rest = found
    return _arguments(row, rest, values)


def _command(words: Iterator[str], values: dict[str, object]) -> tuple[Row, list[str]] | None:
    """The row the leading words name (global options may come before and between
    them); the words after it."""
    noun: str | None = None
    for word in words:
        if word.startswith("-"):
            if not _global(word, words, values):
                return None
        elif noun is None:
            noun = values["noun"] = word
            row = _ROWS.get((noun, None))
            if row is not None:
                return row, list(words)
            if noun not in _NOUNS:
                return None
        else:
            row = _ROWS.get((noun, word))
            if row is None:
                return None
            values["verb"] = word
            return row, list(words)
    return None


def _global(word: str, words: Iterator[str], values: dict[str, object]) -> bool:
    if word in STORE:
        value = next(words, None)
        if value is None or value.startswith("-"):
            return False
        values["store"] = value
    elif word in VERBOSE:
        values["verbose"] = True
    else:
        return False
    return True


def _arguments(row: Row, words: list[str], values: dict[str, object]) -> SimpleNamespace | None:
    options: dict[str, Arg] = {}
    positionals: list[Arg] = []
    for a in _flat(row):
        if a.flags[0].startswith("-"):
            options[a.flags[0]] = a
            values[_dest(a)] = a.options.get("default", False if _is_flag(a) else None)
        else:
            positionals.append(a)
            if _is_optional(a):  # (nargs="?": argparse stores its default when absent)
                values[_dest(a)] = a.options.get("default")
    required = sum(not _is_optional(a) for a in positionals)
    given: set[str] = set()
    it = iter(words)
    n = 0
    for word in it:
        if word.startswith("-"):
            option = options.get(word)
            if option is None:
                if not _global(word, it, values):
                    return None
                continue
            given.add(word)
            if _is_flag(option):
                values[_dest(option)] = True
                continue
            a, value = option, next(it, None)
            if value is None or value.startswith("-"):
                return None
        else:
            if n == len(positionals):
                return None
            a, value = positionals[n], word
            n += 1
        converted = _value(a, value)
        if converted is None:
            return None
        values[_dest(a)] = converted
    if n < required or any(o.options.get("required") and f not in given for f, o in options.items()):
        return None
    for group in row.args:
        if isinstance(group, OneOf) and len(given.intersection(a.flags[0] for a in group.args)) != 1:
            return None
    values["func"] = row.func
    return SimpleNamespace(**values)


def _value(a: Arg, word: str) -> object | None:
    """The value argparse stores for `word`, or None where it would refuse it."""
    choices = a.options.get("choices")
    convert = a.options.get("type")
    value: object = word
    if convert is not None:
        try:
            value = convert(word)
        except (TypeError, ValueError):
            return None
    if choices is not None and value not in choices:
        return None
    return value


def _flat(row: Row) -> list[Arg]:
    return [one for a in row.args for one in (a.args if isinstance(a, OneOf) else (a,))]


def _is_flag(a: Arg) -> bool:
    return a.options.get("action") == "store_true"


def _is_optional(a: Arg) -> bool:
    return a.options.get("nargs") == "?"


def _dest(a: Arg) -> str:
    dest = a.options.get("dest")
    if dest is not None:
        return str(dest)
    flag = a.flags[0]
    return flag.lstrip("-").replace("-", "_") if flag.startswith("-") else flag


_ROWS = {(row.noun, row.verb): row for row in GRAMMAR}
_NOUNS = {row.noun for row in GRAMMAR if row.verb is not None}
