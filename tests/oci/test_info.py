"""What an OCI image remembers (digests, entrypoint, cmd, env, workdir, user, labels),
shown by `image info` and given to scripts by `--json`; and stores of older formats,
upgraded to today's format, import OCI images beside what they held."""

from __future__ import annotations

from pathlib import Path

import pytest

from casfs import catalog
from tests.api.test_migration import STORES, format_of, unpack
from tests.helpers.cli import js, ok, out
from tests.helpers.fsck import assert_consistent
from tests.oci import build
from tests.oci.conftest import Sample


def test_info_shows_what_the_image_remembers(store: Path, sample: Sample) -> None:
    ok(store, "image", "import", "s", f"oci:{sample.layout}:v1")
    oci = js(store, "image", "info", "s")["oci"]
    manifest_digest = build.tagged(sample.layout, "v1")["digest"]
    assert oci["manifest_digest"] == manifest_digest and oci["transport"] == "oci"
    assert oci["config_digest"].startswith("sha256:") and oci["index_digest"] is None
    assert oci["entrypoint"] == ["/bin/sh", "/app/run.sh"] and oci["cmd"] == ["one", "two"]
    assert oci["env"] == [f"GREETING={build.GREETING}", "PATH=/bin"]
    assert (oci["workdir"], oci["user"], oci["labels"]) == ("/data", "0:0", {"org.example.name": "sample"})
    assert (oci["os"], oci["architecture"]) == ("linux", "amd64")
    assert [layer["digest"] is not None for layer in oci["layers"]] == [True] * 3
    assert js(store, "image", "ls")[0]["oci"] == oci
    text = out(store, "image", "info", "s")
    for line in (
        f"manifest:               {manifest_digest}",
        f"config:                 {oci['config_digest']}",
        'entrypoint:             ["/bin/sh", "/app/run.sh"]',
        'cmd:                    ["one", "two"]',
        f"env:                    GREETING={build.GREETING} PATH=/bin",
        "workdir:                /data",
        "user:                   0:0",
        "label org.example.name: sample",
    ):
        assert line in text, text


def test_other_images_remember_nothing_of_oci(store: Path, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    ok(store, "image", "import", "d", str(tmp_path / "d"))
    assert js(store, "image", "info", "d")["oci"] is None
    assert "entrypoint" not in out(store, "image", "info", "d")


@pytest.mark.parametrize("version", [v for v in STORES if v >= 6])
def test_an_upgraded_store_imports_oci_images(tmp_path: Path, version: int, sample: Sample) -> None:
    """The stores of format 6 on reach today's format (format 8 added images.oci), keep their images
    (without OCI fields), and take an OCI image that mounts as a volume."""
    store, expected = unpack(version, tmp_path / "old")
    ok(store, "image", "import", "s", f"oci:{sample.layout}:v1")
    assert format_of(store) == catalog.FORMAT_VERSION
    images = {i["name"]: i for i in js(store, "image", "ls")}
    assert set(images) == {*expected["images"], "s"}
    assert [i["oci"] for n, i in images.items() if n != "s"] == [None] * len(expected["images"])
    assert images["s"]["oci"]["cmd"] == ["one", "two"]
    ok(store, "volume", "create", "c", "--from", "s")
    assert_consistent(store)
