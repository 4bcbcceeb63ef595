"""casfs.cli.quick against argparse (casfs.cli.parser), over command lines drawn from
the grammar: plain ones, and ones with what quick leaves to argparse (help, --version,
`--flag=value`, abbreviations, unknown options, values starting with '-', missing and
extra words, two of a group or none, a value outside its choices).

Whenever quick returns a namespace, argparse accepts the line and returns the same
one; whenever the line is plain and argparse accepts it, quick takes it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from casfs.cli import parser, quick
from casfs.cli.grammar import GRAMMAR, Arg, OneOf, Row

WORDS = ("a", "img", "v@1", "vm-1", "10G", "1.5", "raw", "tar", "", "x y", "create", "volume")
JUNK = ("-h", "--help", "--version", "--", "-", "--nope", "-sX", "-vv")


def _argparse(argv: list[str]) -> dict[str, Any] | None:
    try:
        return vars(parser.parse(argv))
    except SystemExit:
        return None


def _quick(argv: list[str]) -> dict[str, Any] | None:
    ns = quick.parse(argv)
    return None if ns is None else vars(ns)


@st.composite
def lines(draw: st.DrawFn) -> tuple[list[str], bool]:
    """A command line of one row, and whether it is plain (nothing quick refuses on
    sight: no junk word, no `=`, no abbreviation, no value starting with '-')."""
    row: Row = draw(st.sampled_from(GRAMMAR))
    plain = True

    def value(a: Arg | None = None) -> str:
        nonlocal plain
        pool = list(WORDS) + list(a.options.get("choices", ()) if a is not None else ())
        v = draw(st.sampled_from(pool) | st.sampled_from(("-1", "-x")))
        plain &= not v.startswith("-")
        return v

    units: list[list[str]] = []  # options and flags, placed anywhere after the command
    for a in row.args:
        members = a.args if isinstance(a, OneOf) else (a,)
        for one in members:
            flag = one.flags[0]
            if not flag.startswith("-"):
                continue
            if isinstance(a, OneOf):
                # the group's first member mostly alone; sometimes none, or two
                want = draw(st.integers(0, 9)) < (6 if one is members[0] else 2)
            else:
                want = draw(st.booleans())
            if not want:
                continue
            if draw(st.integers(0, 19)) == 0:  # an abbreviation, or flag=value
                plain = False
                if one.options.get("action") == "store_true":
                    units.append([flag[:-1]])
                else:
                    units.append([f"{flag}={value(one)}"])
            elif one.options.get("action") == "store_true":
                units.append([flag])
            elif draw(st.integers(0, 19)) == 0:
                units.append([flag])  # its value missing (or the next word taken for it)
            else:
                units.append([flag, value(one)])
    positionals = [value(a) for a in row.args if isinstance(a, Arg) and not a.flags[0].startswith("-")]
    cut = draw(st.integers(0, 9))
    if cut == 0 and positionals:
        positionals.pop()  # one missing
    elif cut == 1:
        positionals.append(value())  # one too many
    for _ in range(draw(st.integers(0, 2))):
        units.append(draw(st.sampled_from([["-s", "S2"], ["--store", "S3"], ["-v"], ["--verbose"]])))
    if draw(st.integers(0, 9)) == 0:
        units.append([draw(st.sampled_from(JUNK))])
        plain = False
    after: list[str] = []
    rest = list(positionals)
    shuffled: list[list[str]] = draw(st.permutations(units))
    for unit in shuffled:
        while rest:  # (some positionals before each option)
            if not draw(st.booleans()):
                break
            after.append(rest.pop(0))
        after.extend(unit)
    after.extend(rest)
    before = draw(st.sampled_from([[], ["-s", "S"], ["--store", "S", "-v"], ["-v"], ["-s"]]))
    command = [row.noun] if row.verb is None else [row.noun, row.verb]
    if row.verb is not None and draw(st.integers(0, 4)) == 0:
        command = [row.noun, "-s", "S4", row.verb]
    if draw(st.integers(0, 9)) == 0:
        before = [*before, draw(st.sampled_from(JUNK))]
        plain = False
    return [*before, *command, *after], plain


@settings(max_examples=1000, deadline=None)
@given(lines())
def test_quick_agrees_with_argparse(line: tuple[list[str], bool]) -> None:
    argv, plain = line
    q, a = _quick(argv), _argparse(argv)
    if q is not None:
        assert q == a, argv
    if plain and a is not None:
        assert q is not None, argv


@pytest.mark.parametrize(
    "argv",
    [
        ["-s", "S", "volume", "create", "c", "--from", "img"],
        ["volume", "create", "--ro", "c", "--grace", "1h", "--from", "v@1", "-s", "S", "-v"],
        ["volume", "create", "c", "--blank-block", "10G"],
        ["-s", "A", "snapshot", "-s", "B", "create", "v", "-s", "C"],
        ["gc", "--repack-below", "0.25", "--json"],
        ["image", "export", "i", "out.tar", "--format", "tar"],
        ["init"],
    ],
)
def test_plain_lines_are_parsed_without_argparse(argv: list[str]) -> None:
    q = _quick(argv)
    assert q is not None
    assert q == _argparse(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["volume", "create", "-h"],
        ["volume", "create", "c", "--from=img"],
        ["volume", "create", "c", "--fr", "img"],
        ["volume", "create", "c", "--from", "img", "--blank-dir"],
        ["volume", "create", "c"],
        ["volume", "create", "c", "--from"],
        ["volume", "create", "c", "--from", "img", "-s"],
        ["-s"],
        ["volume", "create", "c", "--from", "-x"],
        ["volume", "rm"],
        ["volume", "rm", "a", "b"],
        ["volume"],
        ["volumes", "ls"],
        ["image", "export", "i", "out", "--format", "zip"],
        ["gc", "--repack-below", "half"],
        [],
    ],
)
def test_other_lines_are_left_to_argparse(argv: list[str]) -> None:
    assert quick.parse(argv) is None
