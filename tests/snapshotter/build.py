"""A tiny image for the snapshotter's tests, built offline with umoci: a static busybox
(Debian's busybox-static) and its applets in layer 1, a few files in layer 2 (and a
whiteout of one of layer 1's), a config whose default command prints a file."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.oci.build import run, umoci_base

BUSYBOX = "/bin/busybox"
APPLETS = ("sh", "cat", "echo", "ls", "true", "sleep", "rm", "mkdir", "sha256sum", "touch", "sync")
HELLO = "hello from a casfs rootfs\n"


def build_busybox(work: Path, tag: str = "v1", trees: tuple[str, ...] = ()) -> Path:
    """The image as an OCI layout at work/busybox (tag `tag`); `trees`: copies of these
    host directories in layer 2 too (a bigger image, for the benchmark)."""
    layout, bundle = umoci_base(work / "busybox", work / "bb-bundle")
    rootfs = bundle / "rootfs"
    (rootfs / "bin").mkdir(exist_ok=True)
    shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in APPLETS:
        os.symlink("busybox", rootfs / "bin" / applet)
    for d in ("etc", "tmp", "data", "proc", "sys", "dev"):
        (rootfs / d).mkdir(exist_ok=True)
    (rootfs / "etc" / "gone.txt").write_text("layer 2 deletes this\n")
    run("umoci", "repack", "--image", f"{layout}:l1", bundle)
    shutil.rmtree(bundle)
    run("umoci", "unpack", "--image", f"{layout}:l1", bundle)
    (rootfs / "etc" / "hello.txt").write_text(HELLO)
    (rootfs / "etc" / "gone.txt").unlink()
    (rootfs / "data" / "big.bin").write_bytes(os.urandom(1 << 20))
    for t in trees:
        dest = rootfs / t.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        run("cp", "-a", t, dest)
    run("umoci", "repack", "--image", f"{layout}:l2", bundle)
    shutil.rmtree(bundle)
    run(
        "umoci", "config", "--image", f"{layout}:l2", "--tag", tag,
        "--config.cmd", "/bin/cat", "--config.cmd", "/etc/hello.txt",
        "--config.env", "PATH=/bin", "--architecture", "amd64", "--os", "linux",
    )  # fmt: skip
    for t in ("base", "l1", "l2"):
        run("umoci", "rm", "--image", f"{layout}:{t}")  # (ctr imports every tag)
    return layout


def archive(layout: Path, out: Path) -> Path:
    """The layout as one tar (what `ctr images import` reads)."""
    subprocess.run(["tar", "-C", str(layout), "-cf", str(out), "."], check=True)
    return out
