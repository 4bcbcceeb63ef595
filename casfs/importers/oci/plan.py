"""What an image source gives the importer, whichever transport it came by: the
verified config (what the image remembers) and the layers to apply, each with the
digests to check it against."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from casfs.errors import UsageError
from casfs.importers.oci.digests import parse_digest

MAX_JSON = 4 << 20  # a manifest, index or config larger than this is refused (containerd: 4 MiB)
DEFAULT_PLATFORM = "linux/amd64"

Opener = Callable[[], AbstractContextManager[BinaryIO]]


@dataclass(frozen=True)
class Layer:
    what: str  # "layer 2 of 3 (sha256:...)", for messages
    digest: str | None  # of the blob as stored, checked before it is read; None: the source names none
    size: int | None
    diff_id: str  # sha256 of the uncompressed tar, from the config
    open: Opener


@dataclass(frozen=True)
class Config:
    """The image config's fields a runtime needs (OCI image-spec config.md)."""

    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    workdir: str = ""
    user: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    os: str = ""
    architecture: str = ""
    variant: str = ""


@dataclass(frozen=True)
class Plan:
    transport: str
    manifest_digest: str | None  # None for a docker-archive: it holds no registry manifest
    index_digest: str | None  # the image index the tag named, when it named one
    config_digest: str
    config: Config
    layers: list[Layer]

    def expect_targets(self) -> list[str]:
        """The digests --expect may name: the manifest's (or the index the tag named);
        a docker-archive's image id (its config digest)."""
        found = [self.index_digest, self.manifest_digest] if self.manifest_digest else [self.config_digest]
        return [d for d in found if d is not None]


def load_json(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"the image is invalid: {what} is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"the image is invalid: {what} is not a JSON object")
    return doc


def parse_config(raw: bytes, layers: int) -> tuple[Config, list[str]]:
    """The config's runtime fields and its diff_ids (one per layer, or UsageError)."""
    doc = load_json(raw, "the config")
    rootfs = doc.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list) or len(diff_ids) != layers:
        raise UsageError(f"the image is invalid: the config lists no diff_id for each of its {layers} layers")
    for i, d in enumerate(diff_ids):
        parse_digest(d, f"diff_id {i + 1}")
    c = doc.get("config") or {}
    if not isinstance(c, dict):
        raise UsageError("the image is invalid: its config's config is not an object")
    config = Config(
        entrypoint=_strings(c.get("Entrypoint"), "Entrypoint"),
        cmd=_strings(c.get("Cmd"), "Cmd"),
        env=_strings(c.get("Env"), "Env"),
        workdir=_string(c.get("WorkingDir"), "WorkingDir"),
        user=_string(c.get("User"), "User"),
        labels=_labels(c.get("Labels")),
        os=_string(doc.get("os"), "os"),
        architecture=_string(doc.get("architecture"), "architecture"),
        variant=_string(doc.get("variant"), "variant"),
    )
    return config, list(diff_ids)


def _strings(v: object, what: str) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise UsageError(f"the image is invalid: config {what} is not a list of strings")
    return list(v)


def _string(v: object, what: str) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise UsageError(f"the image is invalid: config {what} is not a string")
    return v


def _labels(v: object) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(x, str) for kv in v.items() for x in kv):
        raise UsageError("the image is invalid: config Labels is not a map of strings")
    return dict(v)


def parse_platform(text: str) -> tuple[str, str, str]:
    """OS/ARCH[/VARIANT] -> (os, arch, variant)."""
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise UsageError(f"invalid platform {text!r}: OS/ARCH[/VARIANT], e.g. linux/amd64 or linux/arm64/v8")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else ""
