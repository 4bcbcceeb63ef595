"""Reading an OCI image layout (image-spec image-layout.md): `oci-layout`, `index.json`,
`blobs/ALG/HEX`. index.json -> the tag's descriptor -> (an image index: the platform's
manifest) -> manifest -> config and layers. Every JSON blob is checked against its
descriptor's digest and size before it is parsed; layers are checked by the importer."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from casfs.errors import DigestMismatch, UsageError
from casfs.importers.oci.digests import check, digest_of, parse_digest
from casfs.importers.oci.plan import MAX_JSON, Layer, Plan, load_json, parse_config, parse_platform
from casfs.importers.oci.reference import Reference

REF_NAME = "org.opencontainers.image.ref.name"
INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root
        if not (root / "oci-layout").is_file() or not (root / "index.json").is_file():
            raise UsageError(f"{root} is not an OCI image layout (no oci-layout or index.json)")

    def path(self, digest: object, what: str) -> Path:
        algo, hexdigest = parse_digest(digest, what)
        p = self.root / "blobs" / algo / hexdigest
        if not p.is_file():  # (a symlink is followed: what it names is hashed all the same)
            if p.exists() or p.is_symlink():
                raise UsageError(f"the layout is invalid: {what} ({digest}) is not a regular file")
            raise UsageError(f"the layout is incomplete: {what} ({digest}) is missing from {self.root}")
        return p

    def json_blob(self, desc: dict[str, Any], what: str) -> dict[str, Any]:
        """A small blob, checked against its descriptor, parsed."""
        raw = self.checked_bytes(desc, what)
        return load_json(raw, what)

    def checked_bytes(self, desc: dict[str, Any], what: str) -> bytes:
        digest, size = desc.get("digest"), desc.get("size")
        if not isinstance(size, int) or size < 0 or size > MAX_JSON:
            raise UsageError(f"the image is invalid: {what} has size {size!r} (at most {MAX_JSON} bytes)")
        path = self.path(digest, what)
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON + 1)
        assert isinstance(digest, str)
        check(digest_of(raw, parse_digest(digest, what)[0]), digest, what)
        if len(raw) != size:
            raise DigestMismatch(
                f"{what} is {len(raw)} bytes, its descriptor says {size}; nothing was stored"
            )
        return raw

    @contextmanager
    def opener(self, path: Path) -> Iterator[BinaryIO]:
        with open(path, "rb") as f:
            yield f


def read_layout(ref: Reference, platform: str | None) -> Plan:
    layout = Layout(ref.path)
    with open(layout.root / "index.json", "rb") as f:
        raw = f.read(MAX_JSON + 1)
    if len(raw) > MAX_JSON:
        raise UsageError(f"the layout is invalid: index.json is larger than {MAX_JSON} bytes")
    index = load_json(raw, "index.json")
    desc = _by_tag(_descriptors(index, "index.json"), ref)
    index_digest = None
    for _ in range(4):  # an index may name an index; a few levels at most
        if not _is_index(desc):
            break
        index_digest = index_digest or desc["digest"]
        nested = layout.json_blob(desc, f"image index {desc.get('digest')}")
        desc = _by_platform(_descriptors(nested, "the image index"), platform)
    else:
        raise UsageError("the image is invalid: image indexes nested too deeply")
    manifest_digest = desc.get("digest")
    manifest = layout.json_blob(desc, f"manifest {manifest_digest}")
    config_desc = manifest.get("config")
    layers = manifest.get("layers")
    if not isinstance(config_desc, dict) or not isinstance(layers, list):
        raise UsageError("the image is invalid: its manifest has no config or layers")
    config_digest = config_desc.get("digest")
    config, diff_ids = parse_config(layout.checked_bytes(config_desc, "the config"), len(layers))
    if platform is not None and index_digest is None:
        _check_platform(config.os, config.architecture, config.variant, platform)
    out = []
    for i, (ld, diff_id) in enumerate(zip(layers, diff_ids, strict=True)):
        if not isinstance(ld, dict):
            raise UsageError(f"the image is invalid: layer {i + 1} is not a descriptor")
        what = f"layer {i + 1} of {len(layers)} ({ld.get('digest')})"
        path = layout.path(ld.get("digest"), what)
        size = ld.get("size")
        if not isinstance(size, int) or size < 0:
            raise UsageError(f"the image is invalid: {what} has no size")
        out.append(Layer(what, str(ld["digest"]), size, diff_id, functools.partial(layout.opener, path)))
    assert isinstance(manifest_digest, str) and isinstance(config_digest, str)
    return Plan("oci", manifest_digest, index_digest, config_digest, config, out)


def _descriptors(doc: dict[str, Any], what: str) -> list[dict[str, Any]]:
    found = doc.get("manifests")
    if not isinstance(found, list) or not all(isinstance(d, dict) for d in found):
        raise UsageError(f"the image is invalid: {what} lists no manifests")
    return found


def _is_index(desc: dict[str, Any]) -> bool:
    media = desc.get("mediaType")
    if media in INDEX_TYPES:
        return True
    if media in MANIFEST_TYPES:
        return False
    raise UsageError(f"the image is invalid: unsupported manifest media type {media!r}")


def _tags(found: list[dict[str, Any]]) -> list[str]:
    return sorted({str((d.get("annotations") or {}).get(REF_NAME)) for d in found} - {"None"})


def _by_tag(found: list[dict[str, Any]], ref: Reference) -> dict[str, Any]:
    if ref.tag is None:
        if len(found) == 1:
            return found[0]
        raise UsageError(f"{ref} holds {len(found)} images: name one with :TAG ({', '.join(_tags(found))})")
    named = [d for d in found if (d.get("annotations") or {}).get(REF_NAME) == ref.tag]
    if len(named) != 1:
        why = "no image" if not named else "several images"
        raise UsageError(
            f"{ref.path} has {why} tagged {ref.tag!r} (tags: {', '.join(_tags(found)) or 'none'})"
        )
    return named[0]


def _by_platform(found: list[dict[str, Any]], platform: str | None) -> dict[str, Any]:
    want = parse_platform(platform or "linux/amd64")
    seen = []
    for d in found:
        p = d.get("platform") or {}
        have = (str(p.get("os")), str(p.get("architecture")), str(p.get("variant") or ""))
        seen.append("/".join(x for x in have if x))
        if have[:2] == want[:2] and (not want[2] or have[2] == want[2]):
            return d
    raise UsageError(
        f"the image has no {'/'.join(x for x in want if x)} manifest "
        f"(it has: {', '.join(seen)}; --platform chooses)"
    )


def _check_platform(os_: str, arch: str, variant: str, platform: str) -> None:
    want = parse_platform(platform)
    if (os_, arch) != want[:2] or (want[2] and variant != want[2]):
        raise UsageError(f"the image is {os_}/{arch}{'/' + variant if variant else ''}, not {platform}")
