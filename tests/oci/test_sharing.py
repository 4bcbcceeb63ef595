"""Images that share base layers share their storage, and a later import starts from
the stored tree of the longest shared stack of layers (its chain id) instead of applying
those layers again (their blobs are only checked): the same tree as a fresh import,
stored once."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.cli import js, ok, out
from tests.oci.conftest import Debian, Sample


def images(store: Path) -> dict[str, dict[str, object]]:
    return {i["name"]: i for i in js(store, "image", "ls")}


def test_a_shared_base_is_read_once_and_stored_once(store: Path, tmp_path: Path, sample: Sample) -> None:
    ok(store, "image", "import", "l1", f"oci:{sample.layout}:l1")
    said = out(store, "image", "import", "v1", f"oci:{sample.layout}:v1")
    assert "1 of 3 layers shared with a stored image" in said
    oci = js(store, "image", "info", "v1")["oci"]
    assert oci["layers_reused"] == 1
    # the same tree as a fresh store's import of v1, which reads every layer
    fresh = tmp_path / "fresh"
    ok(fresh, "init")
    ok(fresh, "image", "import", "v1", f"oci:{sample.layout}:v1")
    assert js(fresh, "image", "info", "v1")["oci"]["layers_reused"] == 0
    assert js(fresh, "image", "info", "v1")["root"] == js(store, "image", "info", "v1")["root"]
    # What v1 adds over l1 is a few KiB: the base's chunks are l1's too.
    got = images(store)
    assert got["v1"]["unique"] < 64 << 10 < got["v1"]["stored"]  # type: ignore[operator]
    # An image of every layer again (the docker-archive) applies none and stores nothing.
    before = js(store, "image", "ls")
    said = out(store, "image", "import", "da", f"docker-archive:{sample.archive}")
    assert "3 of 3 layers shared" in said and "stored 0 B new" in said
    assert [i["stored"] for i in js(store, "image", "ls") if i["name"] != "da"] == [
        i["stored"] for i in before
    ]


def test_an_image_of_another_images_first_layers(store: Path, sample: Sample) -> None:
    """v1 keeps the trees of its first one and two layers: l1 and l2 start from them,
    apply nothing and store nothing; removing v1 and gc leaves them whole."""
    ok(store, "image", "import", "v1", f"oci:{sample.layout}:v1")
    for tag, n in (("l2", 2), ("l1", 1)):
        said = out(store, "image", "import", tag, f"oci:{sample.layout}:{tag}")
        assert f"{n} of {n} layers shared" in said and "stored 0 B new" in said, said
    ok(store, "image", "rm", "v1")
    assert js(store, "gc")["blobs_freed"] > 0
    ok(store, "volume", "create", "c", "--from", "l2")
    ok(store, "volume", "export", "c", str(store.parent / "l2-tree"))
    assert (store.parent / "l2-tree" / "layer2.txt").read_text() == "added by layer 2\n"


def test_a_debian_app_image_over_its_base(store: Path, debian: Debian) -> None:
    ok(store, "image", "import", "base", f"oci:{debian.layout}:debian-base", timeout=600)
    said = out(store, "image", "import", "app", f"oci:{debian.layout}:debian", timeout=600)
    assert "1 of 2 layers shared" in said
    got = images(store)
    base, app = got["base"], got["app"]
    assert app["unique"] < base["stored"] // 50  # type: ignore[operator]
    table = out(store, "image", "ls")
    assert "base" in table and "app" in table
