"""The argparse parser made from the grammar (grammar.py): the authority on every
command line, its help and its errors (quick.py parses the plain ones without it).

Orchestrators call the CLI once per volume, so the parser is made lazily: each level
lists its subcommands by name and help line, and argparse gets the parser of a noun or
a command only when it picks that one (`_Lazy`). `--help` at any level reads the same
as a parser built whole.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import TYPE_CHECKING

from casfs import __version__
from casfs.cli.grammar import GRAMMAR, NOUNS, OneOf, Row

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn

    _SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    _SubParsers = argparse._SubParsersAction


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in the one-line form every casfs error takes."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"casfs: error: {message} (see `{self.prog} --help`)\n")

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse makes one for every add_argument (to check its metavar), and a
        # formatter not told its width imports shutil to ask the terminal: shutil and
        # the compression modules it imports were a tenth of a short command's start-up.
        # (typeshed's formatter class takes prog only; every HelpFormatter takes a width)
        return self.formatter_class(prog=self.prog, width=_columns() - 2)  # type: ignore[call-arg]


def _columns() -> int:
    """The terminal's width, as shutil.get_terminal_size() finds it ($COLUMNS first)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    out = sys.__stdout__
    try:
        return (os.get_terminal_size(out.fileno()).columns if out is not None else 0) or 80
    except (ValueError, OSError):
        return 80


class _Lazy(_SubParsers):
    """Subcommands known by name and help line only, until argparse picks one: then that
    one's parser is made. (Every ArgumentParser costs a few gettext look-ups, which
    normalize the locale each time: making only the chosen ones halves `casfs`'s parsing.)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._makers: dict[str, Callable[[], object]] = {}

    def add_lazy(self, name: str, help: str, make: Callable[[], object], stand_in: _Parser) -> None:
        """`make` calls add_parser(name) without help= (the help line is listed here)."""
        self._choices_actions.append(self._ChoicesPseudoAction(name, (), help))
        self._name_parser_map[name] = stand_in  # (a valid choice; replaced when chosen)
        self._makers[name] = make

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, list)
        make = self._makers.pop(values[0], None)
        if make is not None:
            del self._name_parser_map[values[0]]
            make()
        super().__call__(parser, namespace, values, option_string)


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


def _make_command(sub: _Lazy, name: str, row: Row, common: _Parser) -> None:
    p = sub.add_parser(
        name,
        description=row.description or row.help,
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=row.func)
    for a in row.args:
        if isinstance(a, OneOf):
            group = p.add_mutually_exclusive_group(required=True)
            for one in a.args:
                group.add_argument(*one.flags, **one.options)
        else:
            p.add_argument(*a.flags, **a.options)


def _make_noun(sub: _Lazy, noun: str, rows: Sequence[Row], common: _Parser) -> None:
    p = sub.add_parser(noun, description=NOUNS[noun], parents=[common])
    # (prog given: argparse would format a usage line to find it, importing shutil)
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True, action=_Lazy, prog=p.prog)
    assert isinstance(verbs, _Lazy)
    for row in rows:
        assert row.verb is not None
        verbs.add_lazy(
            row.verb, row.help, functools.partial(_make_command, verbs, row.verb, row, common), common
        )


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
    nouns = parser.add_subparsers(
        dest="noun", metavar="COMMAND", required=True, action=_Lazy, prog=parser.prog
    )
    assert isinstance(nouns, _Lazy)
    by_noun: dict[str, list[Row]] = {}
    for row in GRAMMAR:
        by_noun.setdefault(row.noun, []).append(row)
    for noun, rows in by_noun.items():
        if rows[0].verb is None:
            make = functools.partial(_make_command, nouns, noun, rows[0], common)
            nouns.add_lazy(noun, rows[0].help, make, common)
        else:
            nouns.add_lazy(
                noun, NOUNS[noun], functools.partial(_make_noun, nouns, noun, rows, common), common
            )
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)
