"""List's filters, in containerd's filter syntax (its `filters` package, as `ctr snapshots
ls` and clients of the Snapshots API write them):

    filters   any of them matches (OR)
    filter    selector("," selector)*                  every selector matches (AND)
    selector  fieldpath [("==" | "!=" | "~=") value]   without an operator: the field is present
    fieldpath field("." field)*                        field: a name or a "quoted" string
    value     a "quoted" string, /a regexp/, or text up to the next ","

The fields of a snapshot (containerd's snapshot adaptor): name, parent, kind (active,
view, committed), always present, and labels.KEY. `==` needs the field present; `!=`
and `~=` (a regular expression, searched) compare an absent field as "". Anything else
(another field, bad syntax, a bad regular expression) is refused, never ignored:
InvalidArgument. containerd's own use: after a remote snapshot's AlreadyExists it finds
the snapshot by `labels."containerd.io/snapshot.ref"==CHAIN,parent==PARENT`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from casfs.errors import UsageError
from casfs.snapshotter.records import Record

OPERATORS = ("==", "!=", "~=")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Selector:
    path: tuple[str, ...]
    operator: str | None
    value: str
    pattern: re.Pattern[str] | None = None

    def matches(self, rec: Record) -> bool:
        value, present = field_of(rec, self.path)
        if self.operator is None:
            return present
        if self.operator == "==":
            return present and value == self.value
        if self.operator == "!=":
            return value != self.value
        assert self.pattern is not None
        return self.pattern.search(value) is not None


def field_of(rec: Record, path: tuple[str, ...]) -> tuple[str, bool]:
    """(the value, whether it is present) of a field of a snapshot."""
    if path in (("name",), ("parent",), ("kind",)):
        # (always present, "" for no parent: containerd's own Walk after a remote
        # snapshot's AlreadyExists asks for `parent==""`)
        return {"name": rec.key, "parent": rec.parent, "kind": rec.kind}[path[0]], True
    if len(path) >= 2 and path[0] == "labels":
        key = ".".join(path[1:])
        return rec.labels.get(key, ""), key in rec.labels
    raise UsageError(f"cannot filter snapshots by {'.'.join(path)!r}: by name, parent, kind or labels.KEY")


def compile_filters(filters: list[str]) -> Callable[[Record], bool]:
    """A test of a snapshot: True if any filter matches (no filter: every snapshot)."""
    parsed = [parse(f) for f in filters if f.strip()]
    if not parsed:
        return lambda rec: True
    probe = Record("", "active")
    for selectors in parsed:
        for s in selectors:
            field_of(probe, s.path)  # (an unknown field is refused even if nothing is listed)
    return lambda rec: any(all(s.matches(rec) for s in selectors) for selectors in parsed)


def parse(text: str) -> list[Selector]:
    """One filter: its selectors (UsageError for bad syntax)."""
    scan = _Scanner(text)
    selectors = [scan.selector()]
    while scan.take(","):
        selectors.append(scan.selector())
    scan.skip_space()
    if not scan.done():
        scan.fail("a ',' or the end")
    return selectors


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def done(self) -> bool:
        return self.pos >= len(self.text)

    def skip_space(self) -> None:
        while not self.done() and self.text[self.pos].isspace():
            self.pos += 1

    def take(self, token: str) -> bool:
        self.skip_space()
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def fail(self, wanted: str) -> None:
        raise UsageError(f"invalid filter {self.text!r}: {wanted} expected at offset {self.pos}")

    def selector(self) -> Selector:
        path = [self.field()]
        while self.take("."):
            path.append(self.field())
        operator = next((op for op in OPERATORS if self.take(op)), None)
        if operator is None:
            return Selector(tuple(path), None, "")
        value = self.value()
        pattern = None
        if operator == "~=":
            try:
                pattern = re.compile(value)
            except re.error as e:
                raise UsageError(f"invalid filter {self.text!r}: bad regular expression: {e}") from None
        return Selector(tuple(path), operator, value, pattern)

    def field(self) -> str:
        self.skip_space()
        if self.text.startswith('"', self.pos):
            return self.quoted('"')
        found = _NAME.match(self.text, self.pos)
        if found is None:
            self.fail("a field name")
        assert found is not None
        self.pos = found.end()
        return found.group()

    def value(self) -> str:
        self.skip_space()
        for quote in ('"', "/"):
            if self.text.startswith(quote, self.pos):
                return self.quoted(quote)
        end = self.text.find(",", self.pos)
        end = len(self.text) if end < 0 else end
        value, self.pos = self.text[self.pos : end].strip(), end
        if not value:
            self.fail("a value")
        return value

    def quoted(self, quote: str) -> str:
        """A string between `quote`s, a backslash escaping the next character."""
        out, i = [], self.pos + 1
        while i < len(self.text):
            c = self.text[i]
            if c == "\\" and i + 1 < len(self.text):
                nxt = self.text[i + 1]
                # (in a /regexp/ only \/ is ours: other escapes are the expression's)
                out.append(nxt if quote == '"' or nxt == "/" else c + nxt)
                i += 2
                continue
            if c == quote:
                self.pos = i + 1
                return "".join(out)
            out.append(c)
            i += 1
        self.fail(f"a closing {quote}")
        return ""
