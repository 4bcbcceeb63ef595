"""Refused OCI images leave the store exactly as it was: exit 5 for content that is not
what its digests say (a layer's bytes, a diff_id, --expect), exit 2 for a layout that
is incomplete and for layer entries that would escape the root. Checked against a
store already holding an image: same blob files, same catalog rows, gc frees nothing,
and fsck (when each test ends) is clean."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.helpers.blobs import stored_files
from tests.helpers.cli import fails, js, ok
from tests.helpers.fsck import query
from tests.oci import build
from tests.oci.conftest import Sample

REG, DIR, SYM, LNK = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE


def snapshot(store: Path) -> tuple[list[str], int, list[str]]:
    files = stored_files(store)
    (rows,) = query(store, "SELECT count(*) FROM blobs")[0]
    return files, rows, [i["name"] for i in js(store, "image", "ls")]


@pytest.fixture
def layout(store: Path, tmp_path: Path, sample: Sample) -> Path:
    """A copy of the sample layout to damage; the store already holds its `l1` image."""
    copy = tmp_path / "layout"
    shutil.copytree(sample.layout, copy)
    ok(store, "image", "import", "base", f"oci:{copy}:l1")
    return copy


def refused(store: Path, code: int, source: str, *extra: str) -> str:
    before = snapshot(store)
    line = fails(store, code, "image", "import", "x", source, *extra)
    assert snapshot(store) == before
    assert js(store, "gc")["blobs_freed"] == 0
    return line


def layer_path(layout: Path, tag: str, n: int) -> Path:
    manifest = json.loads(build.read_blob(layout, build.tagged(layout, tag)["digest"]))
    digest: str = manifest["layers"][n]["digest"]
    return layout / "blobs" / "sha256" / digest.split(":")[1]


def damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_layer_whose_bytes_are_not_its_digest(store: Path, layout: Path) -> None:
    damage(layer_path(layout, "v1", 1))
    line = refused(store, 5, f"oci:{layout}:v1")
    assert "digest mismatch: layer 2 of 3" in line and "nothing was stored" in line


def test_a_layer_the_store_holds_is_checked_too(store: Path, layout: Path, sample: Sample) -> None:
    """Issue 32: layer 1, held as image `base`, is not applied again, but the source's
    blob for it is still checked: damaged, or of another size than its descriptor says,
    the import is refused (it was imported with exit 0, never read)."""
    path = layer_path(layout, "v1", 0)
    damage(path)
    line = refused(store, 5, f"oci:{layout}:v1")
    assert "digest mismatch: layer 1 of 3" in line and "nothing was stored" in line
    shutil.copy(sample.layout / path.relative_to(layout), path)  # (undone)
    manifest = json.loads(build.read_blob(layout, build.tagged(layout, "v1")["digest"]))
    manifest["layers"][0]["size"] += 1
    build.write_manifest(layout, manifest, "wrong-size")
    line = refused(store, 5, f"oci:{layout}:wrong-size")
    assert "layer 1 of 3" in line and "its descriptor says" in line
    assert "1 of 3 layers shared" in ok(store, "image", "import", "x", f"oci:{layout}:v1").stdout


def test_a_docker_archive_layer_the_store_holds_is_checked_too(
    store: Path, tmp_path: Path, sample: Sample
) -> None:
    ok(store, "image", "import", "held", f"docker-archive:{sample.archive}")
    archive = tmp_path / "damaged.tar"
    shutil.copy(sample.archive, archive)
    _flip_layer_byte(archive, 0)
    assert "digest mismatch: layer 1 of 3" in refused(store, 5, f"docker-archive:{archive}")


def test_a_wrong_diff_id(store: Path, layout: Path) -> None:
    manifest = json.loads(build.read_blob(layout, build.tagged(layout, "v1")["digest"]))
    config = json.loads(build.read_blob(layout, manifest["config"]["digest"]))
    diff_ids = config["rootfs"]["diff_ids"]
    diff_ids[1] = "sha256:" + "0" * 64
    blob = build._blob(layout, json.dumps(config).encode())
    build.write_manifest(layout, {**manifest, "config": {**manifest["config"], **blob}}, "bad-diff")
    line = refused(store, 5, f"oci:{layout}:bad-diff")
    assert "the uncompressed layer 2 of 3" in line and "(diff_id) should be sha256:000" in line


def test_a_manifest_that_is_not_expected(store: Path, layout: Path) -> None:
    line = refused(store, 5, f"oci:{layout}:v1", "--expect", "sha256:" + "ab" * 32)
    assert "expected sha256:abab" in line and build.tagged(layout, "v1")["digest"] in line
    refused(store, 2, f"oci:{layout}:v1", "--expect", "blake3:" + "ab" * 32)


def test_a_manifest_blob_that_is_not_its_digest(store: Path, layout: Path) -> None:
    path = layout / "blobs" / "sha256" / build.tagged(layout, "v1")["digest"].split(":")[1]
    path.write_bytes(path.read_bytes().replace(b'"schemaVersion":2', b'"schemaVersion": 2'))
    assert "digest mismatch: manifest" in refused(store, 5, f"oci:{layout}:v1")


def test_a_docker_archive_layer_that_is_not_its_digest(store: Path, tmp_path: Path, sample: Sample) -> None:
    archive = tmp_path / "damaged.tar"
    shutil.copy(sample.archive, archive)
    _flip_layer_byte(archive, 0)
    assert "digest mismatch: layer 1 of 3" in refused(store, 5, f"docker-archive:{archive}")


def _flip_layer_byte(archive: Path, n: int) -> None:
    with tarfile.open(archive) as tf:
        member = tf.getmember(json.loads(tf.extractfile("manifest.json").read())[0]["Layers"][n])  # type: ignore[union-attr]
    with open(archive, "r+b") as f:
        f.seek(member.offset_data + member.size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


def test_a_missing_blob(store: Path, layout: Path) -> None:
    layer_path(layout, "v1", 2).unlink()
    line = refused(store, 2, f"oci:{layout}:v1")
    assert "the layout is incomplete: layer 3 of 3" in line and "is missing" in line
    manifest = json.loads(build.read_blob(layout, build.tagged(layout, "l2")["digest"]))
    (layout / "blobs" / "sha256" / manifest["config"]["digest"].split(":")[1]).unlink()
    assert "the config" in refused(store, 2, f"oci:{layout}:l2")


@pytest.mark.parametrize(
    ("layers", "match"),
    [
        ([[("a", REG, "x")], [(".wh...", REG, "")]], "a whiteout of '..'"),
        ([[("d/", DIR, "")], [("d/.wh..", REG, "")]], "a whiteout of '.'"),
        ([[("a", REG, "x")], [("../.wh.a", REG, "")]], "'..' in a path"),
        ([[("esc", SYM, "/etc")], [("esc/.wh.passwd", REG, "")]], "a whiteout beneath a symlink"),
        ([[("h", LNK, "../../etc/passwd")]], "'..' in a path (link target"),
        ([[("d", SYM, "/etc")], [("h", LNK, "d/passwd")]], "hardlink to 'd/passwd', which is not"),
        ([[("a", REG, "x")], [("/abs", REG, "x")]], "absolute path"),
        ([[("up", SYM, "../../..")]], "symlink to '../../..' leaves the root"),
        ([[("l", SYM, "/etc")], [("l/passwd", REG, "x")]], "its parent l is a symlink"),
    ],
)
def test_entries_that_escape_the_root(
    store: Path, layout: Path, layers: list[list[tuple[str, bytes, str]]], match: str
) -> None:
    build.write_image(layout, [build.tar_of(*entries) for entries in layers], "hostile")
    line = refused(store, 2, f"oci:{layout}:hostile")
    assert match in line.replace('"', "'"), line


def test_a_layer_over_the_entry_or_memory_limit_is_refused(store: Path, layout: Path) -> None:
    """Issue 32: a layer's entries and the memory its application takes are bounded by
    store settings; past either the import is refused (exit 2), naming the layer and
    the setting; under them it imports."""
    files = [(f"d{i // 1000}/f{i}", REG, str(i)) for i in range(20_000)]
    dirs = [(f"d{n}", DIR, "") for n in range(20)]
    build.write_image(layout, [build.tar_of(*dirs, *files)], "many")
    ok(store, "config", "set", "import.layer_entries", "1000")
    line = refused(store, 2, f"oci:{layout}:many")
    assert "layer 1 of 1" in line and "more than 1000 entries" in line and "import.layer_entries" in line
    ok(store, "config", "set", "import.layer_entries", "30000")
    ok(store, "config", "set", "import.layer_memory", "1M")
    line = refused(store, 2, f"oci:{layout}:many")
    assert "more than 1.0 MiB of memory" in line and "import.layer_memory" in line
    ok(store, "config", "unset", "import.layer_memory")
    ok(store, "image", "import", "many", f"oci:{layout}:many")
    assert js(store, "image", "info", "many")["phase"] == "ready"
