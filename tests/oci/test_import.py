"""OCI images import as the tree a runtime's own unpacker makes: the mounted image is
`umoci unpack`'s rootfs, entry for entry (types, modes, owners, sizes, contents, link
targets, mtimes, xattrs, hardlinks), from a layout or a docker-archive, whatever the
layers' compression, picking linux/amd64 (or --platform) from an index."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.cli import fails, js, ok, out
from tests.helpers.mount import mounted
from tests.oci import build
from tests.oci.compare import differences, manifest
from tests.oci.conftest import Debian, Sample


def root_of(store: Path, name: str) -> str:
    return str(js(store, "image", "info", name)["root"])


def test_a_layout_mounts_as_umoci_unpacks_it(store: Path, tmp_path: Path, sample: Sample) -> None:
    ok(store, "image", "import", "s", f"oci:{sample.layout}:v1")
    want = manifest(sample.unpacked, root_attrs=True)
    with mounted(store, tmp_path / "mnt", ro=True) as m:
        got = manifest(m.path / "images" / "s", root_attrs=True)
    assert differences(want, got) == []
    # what the layers did is there: a whiteout, an opaque dir, a hardlink into a lower
    # layer, a file over a directory, the xattrs, the setuid bit
    assert "old/gone.txt" not in got and "etc/removed.conf" not in got and "data/pair2" not in got
    assert [k for k in got if k.startswith("old/")] == ["old/new.txt"]
    assert ["data/hardlink-to-lower", "data/target.txt"] in got["[hardlinks]"]
    assert got["was-a-dir"][0] == "-rw-r--r--" and got["data/setuid"][0] == "-rwsr-xr-x"
    assert dict(got["data/xattr.txt"][6]) == {"user.image.note": b"value-1", "user.other": b"\x00\x01binary"}
    assert got["data/owned"][1:3] == (1000, 1000)


def test_layer_compressions_and_docker_archive_give_the_same_tree(store: Path, sample: Sample) -> None:
    ok(store, "image", "import", "gz", f"oci:{sample.layout}:v1")
    for tag in ("v1-zstd", "v1-plain"):
        ok(store, "image", "import", tag, f"oci:{sample.layout}:{tag}")
        assert root_of(store, tag) == root_of(store, "gz"), tag
    ok(store, "image", "import", "da", f"docker-archive:{sample.archive}:sample:v1")
    assert root_of(store, "da") == root_of(store, "gz")
    info = js(store, "image", "info", "da")["oci"]
    assert info["manifest_digest"] is None and info["transport"] == "docker-archive"
    assert info["config_digest"] == js(store, "image", "info", "gz")["oci"]["config_digest"]
    # the only image of the archive needs no tag
    ok(store, "image", "import", "da2", f"docker-archive:{sample.archive}")
    assert root_of(store, "da2") == root_of(store, "gz")


def test_an_index_gives_linux_amd64_unless_told(store: Path, sample: Sample) -> None:
    ok(store, "image", "import", "v1", f"oci:{sample.layout}:v1")
    ok(store, "image", "import", "multi", f"oci:{sample.layout}:multi")
    assert root_of(store, "multi") == root_of(store, "v1")
    index = build.tagged(sample.layout, "multi")["digest"]
    oci = js(store, "image", "info", "multi")["oci"]
    assert (
        oci["index_digest"] == index and oci["manifest_digest"] == build.tagged(sample.layout, "v1")["digest"]
    )
    ok(store, "image", "import", "arm", f"oci:{sample.layout}:multi", "--platform", "linux/arm64")
    arm = js(store, "image", "info", "arm")["oci"]
    assert arm["cmd"] == ["arm"] and arm["architecture"] == "arm64" and len(arm["layers"]) == 1
    line = fails(
        store, 2, "image", "import", "s390", f"oci:{sample.layout}:multi", "--platform", "linux/s390x"
    )
    assert "no linux/s390x manifest" in line and "linux/arm64/v8" in line
    fails(store, 2, "image", "import", "bad", f"oci:{sample.layout}:multi", "--platform", "linux")
    assert "s390" not in out(store, "image", "ls")


def test_expect_names_the_manifest_or_the_index(store: Path, sample: Sample) -> None:
    manifest_digest = build.tagged(sample.layout, "v1")["digest"]
    index = build.tagged(sample.layout, "multi")["digest"]
    ok(store, "image", "import", "a", f"oci:{sample.layout}:v1", "--expect", manifest_digest)
    ok(store, "image", "import", "b", f"oci:{sample.layout}:multi", "--expect", index)
    ok(store, "image", "import", "c", f"oci:{sample.layout}:multi", "--expect", manifest_digest)
    config = js(store, "image", "info", "a")["oci"]["config_digest"]
    ok(store, "image", "import", "d", f"docker-archive:{sample.archive}", "--expect", config)
    # a repeat is a no-op; the same name from another tag is a conflict
    assert "already imported" in out(
        store, "image", "import", "a", f"oci:{sample.layout}:v1", "--expect", manifest_digest
    )
    fails(store, 4, "image", "import", "a", f"oci:{sample.layout}:v1-zstd")


def test_a_tag_is_needed_when_the_layout_holds_several(store: Path, sample: Sample) -> None:
    line = fails(store, 2, "image", "import", "x", f"oci:{sample.layout}")
    assert "name one with :TAG" in line and "v1" in line
    assert "no image tagged 'nope'" in fails(store, 2, "image", "import", "x", f"oci:{sample.layout}:nope")
    fails(store, 3, "image", "import", "x", "oci:/no/such/layout:v1")
    assert js(store, "image", "ls") == []


def test_a_debian_rootfs_matches_umoci_unpack(store: Path, tmp_path: Path, debian: Debian) -> None:
    ok(store, "image", "import", "deb", f"oci:{debian.layout}:debian", timeout=600)
    out_dir = tmp_path / "export"
    ok(store, "image", "export", "deb", str(out_dir), timeout=600)
    want = manifest(debian.unpacked, root_attrs=True)
    assert len(want) > 1000
    assert differences(want, manifest(out_dir, root_attrs=True)) == []
    assert "etc/apt" not in want and json.loads(json.dumps(want["etc/hostname"]))[3] == len("casfs-debian\n")
