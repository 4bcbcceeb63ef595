"""Sources named the way skopeo names them: `oci:DIR[:TAG]`, `docker-archive:FILE[:TAG]`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from casfs.errors import NotFound, UsageError

TRANSPORTS = ("oci", "docker-archive")


@dataclass(frozen=True)
class Reference:
    transport: str  # one of TRANSPORTS
    path: Path
    tag: str | None  # oci: a ref.name annotation; docker-archive: a RepoTags entry

    def __str__(self) -> str:
        return f"{self.transport}:{self.path}" + (f":{self.tag}" if self.tag else "")


def is_reference(source: str) -> bool:
    return any(source.startswith(f"{t}:") for t in TRANSPORTS)


def parse_reference(source: str) -> Reference:
    """Split TRANSPORT:PATH[:TAG]: PATH is the shortest prefix up to a colon that exists
    (so `docker-archive:x.tar:name:tag` names the tag `name:tag`), or all of it."""
    transport, _, rest = source.partition(":")
    if transport not in TRANSPORTS or not rest:
        raise UsageError(f"invalid image source {source!r}: oci:DIR[:TAG] or docker-archive:FILE[:TAG]")
    path, tag = rest, None
    cuts = [i for i, c in enumerate(rest) if c == ":"]
    for i in cuts:
        if Path(rest[:i]).exists():
            path, tag = rest[:i], rest[i + 1 :]
            break
    if tag == "":
        raise UsageError(f"invalid image source {source!r}: an empty tag")
    where = Path(path)
    if not where.exists():
        raise NotFound(f"source {where} does not exist")
    want_dir = transport == "oci"
    if where.is_dir() != want_dir:
        raise UsageError(f"{where} is not {'a directory' if want_dir else 'a file'} ({transport}:)")
    return Reference(transport, where.resolve(), tag)
