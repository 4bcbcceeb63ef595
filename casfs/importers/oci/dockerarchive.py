"""Reading a `docker save` archive (docker-archive, as skopeo calls it): a tar holding
manifest.json ([{"Config", "RepoTags", "Layers"}]), the config and each layer's tar.

It holds no registry manifest: the image is named by its config's digest (the docker
image id), which is checked against the config's file name when that name is a digest,
and which --expect names. A layer stored under its digest (`HEX.tar`, skopeo's form, or
`blobs/sha256/HEX`, newer docker's OCI form) is checked against it before it is read;
every layer's uncompressed bytes are checked against the config's diff_id."""

from __future__ import annotations

import functools
import json
import re
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, BinaryIO

from casfs.errors import UsageError
from casfs.importers.oci.digests import check, digest_of
from casfs.importers.oci.plan import MAX_JSON, Layer, Plan, parse_config, parse_platform
from casfs.importers.oci.reference import Reference

_NAMED = re.compile(r"(?:blobs/sha256/)?([0-9a-f]{64})(?:\.tar|\.json)?")


class Archive:
    """The archive's members, opened once, read by name (random access: it is a file)."""

    def __init__(self, tf: tarfile.TarFile, ref: Reference) -> None:
        self.tf = tf
        self.ref = ref
        self.members = {m.name.removeprefix("./"): m for m in tf.getmembers()}

    def member(self, name: object, what: str) -> tarfile.TarInfo:
        m = self.members.get(str(name).removeprefix("./")) if isinstance(name, str) else None
        if m is None:
            raise UsageError(f"the archive is incomplete: {what} ({name!r}) is missing from {self.ref.path}")
        return m

    def read(self, name: object, what: str) -> bytes:
        m = self.member(name, what)
        if m.size > MAX_JSON:
            raise UsageError(f"the image is invalid: {what} is larger than {MAX_JSON} bytes")
        return self._file(m, what).read()

    def _file(self, m: tarfile.TarInfo, what: str) -> IO[bytes]:
        f = self.tf.extractfile(m)  # (follows a symlink or hardlink member to its target)
        if f is None:
            raise UsageError(f"the archive is invalid: {what} ({m.name}) is not a file")
        return f

    @contextmanager
    def opener(self, m: tarfile.TarInfo, what: str) -> Iterator[BinaryIO]:
        yield self._file(m, what)  # type: ignore[misc]  # (a read-only ExFileObject)


def read_archive(tf: tarfile.TarFile, ref: Reference, platform: str | None) -> Plan:
    archive = Archive(tf, ref)
    try:
        entries = json.loads(archive.read("manifest.json", "manifest.json"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"the archive is invalid: manifest.json is not JSON ({e})") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries) or not entries:
        raise UsageError("the archive is invalid: manifest.json lists no images")
    entry = _by_tag(entries, ref)
    config_raw = archive.read(entry.get("Config"), "the config")
    config_digest = digest_of(config_raw)
    named = _NAMED.fullmatch(str(entry.get("Config")))
    if named:
        check(config_digest, f"sha256:{named.group(1)}", "the config")
    paths = entry.get("Layers")
    if not isinstance(paths, list):
        raise UsageError("the archive is invalid: its manifest.json entry lists no Layers")
    config, diff_ids = parse_config(config_raw, len(paths))
    if platform is not None:
        want = parse_platform(platform)
        if (config.os, config.architecture) != want[:2]:
            raise UsageError(f"the image is {config.os}/{config.architecture}, not {platform}")
    layers = []
    for i, (path, diff_id) in enumerate(zip(paths, diff_ids, strict=True)):
        what = f"layer {i + 1} of {len(paths)} ({path})"
        m = archive.member(path, what)
        named = _NAMED.fullmatch(str(path))
        digest = f"sha256:{named.group(1)}" if named else None
        layers.append(Layer(what, digest, None, diff_id, functools.partial(archive.opener, m, what)))
    return Plan("docker-archive", None, None, config_digest, config, layers)


def _by_tag(entries: list[dict[str, Any]], ref: Reference) -> dict[str, Any]:
    tags = [t for e in entries for t in (e.get("RepoTags") or []) if isinstance(t, str)]
    if ref.tag is None:
        if len(entries) == 1:
            return entries[0]
        raise UsageError(f"{ref} holds {len(entries)} images: name one with :TAG ({', '.join(tags)})")
    want = _normal_tag(ref.tag)
    for e in entries:
        if want in {_normal_tag(t) for t in e.get("RepoTags") or [] if isinstance(t, str)}:
            return e
    raise UsageError(f"{ref.path} has no image tagged {ref.tag!r} (tags: {', '.join(tags) or 'none'})")


def _normal_tag(tag: str) -> str:
    """As docker reads a name: docker.io/library/ implied, :latest when no tag is given."""
    for prefix in ("docker.io/library/", "docker.io/"):
        tag = tag.removeprefix(prefix)
    return tag if ":" in tag.rpartition("/")[2] else f"{tag}:latest"


def open_archive(ref: Reference) -> tarfile.TarFile:
    try:
        return tarfile.open(ref.path, mode="r:")
    except tarfile.TarError as e:
        raise UsageError(f"{ref.path} is not a docker-archive (an uncompressed tar): {e}") from None
