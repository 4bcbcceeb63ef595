"""What a source's name promises is kept: a file named as a tar is read as one or
refused (exit 2, one line, nothing stored), never imported as a disk image; bzip2 and
xz tars are read; `--format raw` imports such a file as a disk image on purpose."""

from __future__ import annotations

import os
import subprocess
import zlib
from pathlib import Path

import pytest

from tests.helpers.blobs import blob_ids
from tests.helpers.cli import casfs, js, ok


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    top = tmp_path / "tree"
    (top / "etc").mkdir(parents=True)
    (top / "etc" / "hostname").write_text("casfs\n")
    (top / "big").write_bytes(os.urandom(200_000))
    os.symlink("etc/hostname", top / "link")
    return top


def tar(tree: Path, out: Path, *flags: str) -> Path:
    subprocess.run(["tar", "-C", str(tree), *flags, "-cf", str(out), "."], check=True)
    return out


def stored_blobs(store: Path) -> int:
    return len(blob_ids(store))


def bad_inputs(tree: Path, tmp: Path) -> dict[str, Path]:
    good = tar(tree, tmp / "good.tar")
    damaged = tmp / "damaged.tar"
    damaged.write_bytes(good.read_bytes()[:3000] + bytes(200) + good.read_bytes()[5000:9000])
    rand = tmp / "x.tar"
    rand.write_bytes(os.urandom(100_000))
    zlibbed = tmp / "x.tar.gz"
    zlibbed.write_bytes(zlib.compress(good.read_bytes()))
    bz = tmp / "bad.tar.bz2"
    bz.write_bytes(b"BZh9" + os.urandom(5000))
    xz = tmp / "bad.tar.xz"
    xz.write_bytes(b"\xfd7zXZ\x00" + os.urandom(5000))
    return {"damaged": damaged, "random": rand, "zlib": zlibbed, "bzip2": bz, "xz": xz}


def test_files_named_as_tars_are_read_as_tars_or_refused(store: Path, tree: Path, tmp_path: Path) -> None:
    for what, path in bad_inputs(tree, tmp_path).items():
        done = casfs(store, "image", "import", what, str(path))
        assert done.returncode == 2, (what, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("casfs: error: "), (what, lines)
    assert (
        "x.tar.gz is named as a gzip-compressed tar archive but is not gzip data"
        in casfs(store, "image", "import", "z", str(tmp_path / "x.tar.gz")).stderr
    )
    assert js(store, "image", "ls") == [] and stored_blobs(store) == 0
    # on purpose, as disk images
    for what, path in bad_inputs(tree, tmp_path).items():
        ok(store, "image", "import", what, str(path), "--format", "raw")
        assert js(store, "image", "info", what)["kind"] == "block"


@pytest.mark.parametrize("flag", ["-j", "-J", "-z", "--zstd"])
def test_compressed_tars_import_and_export_the_same_tree(
    store: Path, tree: Path, tmp_path: Path, flag: str
) -> None:
    suffix = {"-j": ".tar.bz2", "-J": ".tar.xz", "-z": ".tgz", "--zstd": ".tar.zst"}[flag]
    archive = tar(tree, tmp_path / f"t{suffix}", flag)
    ok(store, "image", "import", "t", str(archive))
    assert js(store, "image", "info", "t")["kind"] == "dir"
    out = tmp_path / "out"
    ok(store, "image", "export", "t", str(out))
    diff = subprocess.run(["diff", "-r", "--no-dereference", tree, out], capture_output=True, text=True)
    assert diff.returncode == 0, diff.stdout


def test_device_nodes_name_the_option_that_keeps_them(store: Path, tmp_path: Path) -> None:
    """Issue 7, defect 15: a rootfs tarball with ./dev/full says how to import it."""
    root = tmp_path / "rootfs"
    (root / "dev").mkdir(parents=True)
    subprocess.run(["mknod", str(root / "dev" / "full"), "c", "1", "7"], check=True)
    (root / "etc").mkdir()
    archive = tar(root, tmp_path / "rootfs.tar")
    done = casfs(store, "image", "import", "rootfs", str(archive))
    assert done.returncode == 2
    assert "'./dev/full' refused: device nodes are not allowed" in done.stderr
    assert "--allow-devices" in done.stderr
    ok(store, "image", "import", "rootfs", str(archive), "--allow-devices")
    out = tmp_path / "out"
    ok(store, "image", "export", "rootfs", str(out))
    st = os.stat(out / "dev" / "full")
    assert os.major(st.st_rdev) == 1 and os.minor(st.st_rdev) == 7
