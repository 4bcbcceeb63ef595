"""Test images, built offline with umoci and skopeo (and layers written here where umoci
cannot make them: an opaque directory, a hardlink into a lower layer).

`sample` (oci layout, tag `v1`) has four layers:
  1. umoci repack: /bin/sh (dash) with the libraries it needs, /app/run.sh, /etc files,
     dirs lib/ and old/ with files, a symlink, a file with a user.* xattr, a setuid file,
     a hardlinked pair, a file that layer 2 deletes and one it replaces
  2. umoci repack: deletes old/gone.txt (a whiteout) and etc/removed.conf, replaces
     etc/motd, adds more
  3. written here: opaque directory (old/ keeps only what this layer adds), a
     hardlink to a lower layer's file, a file replacing a directory, a whiteout of a
     path this layer recreates
  4. umoci config: entrypoint, cmd, env, workdir, user, labels (no layer)
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import zstandard

GREETING = "hello from casfs"
# What the image's entrypoint + cmd print (dash alone: no cat, no id).
PRINTS = f"{GREETING}: args=one two cwd=/data motd=second motd\n"


def run(*cmd: str | Path) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{cmd}: {done.stdout}{done.stderr}"
    return done.stdout


def _libs(binary: str) -> list[str]:
    out = run("ldd", binary)
    libs = []
    for line in out.splitlines():
        words = line.split()
        for w in words:
            if w.startswith("/"):
                libs.append(w)
    return libs


def _copy_host(path: str, rootfs: Path) -> None:
    dest = rootfs / path.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(os.path.realpath(path), dest)


def _mtime(path: Path, when: int) -> None:
    os.utime(path, (when, when), follow_symlinks=False)


def _layer1(rootfs: Path) -> None:
    for lib in ["/bin/dash", *_libs("/bin/dash")]:
        _copy_host(lib, rootfs)
    (rootfs / "bin" / "sh").symlink_to("dash")
    app = rootfs / "app"
    app.mkdir()
    (app / "run.sh").write_text(
        '#!/bin/sh\nread motd < /etc/motd\necho "$GREETING: args=$* cwd=$(pwd) motd=$motd"\n'
    )
    (app / "run.sh").chmod(0o755)
    etc = rootfs / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "motd").write_text("first motd\n")
    (etc / "removed.conf").write_text("deleted by layer 2\n")
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n")
    (etc / "group").write_text("root:x:0:\napp:x:1000:\n")
    old = rootfs / "old"
    (old / "sub").mkdir(parents=True)
    (old / "gone.txt").write_text("whited out\n")
    (old / "keep.txt").write_text("hidden by the opaque dir\n")
    (old / "sub" / "deep.txt").write_text("hidden too\n")
    data = rootfs / "data"
    data.mkdir()
    (data / "big.bin").write_bytes(os.urandom(300_000) + bytes(200_000) + os.urandom(1000))
    (data / "target.txt").write_text("a hardlink in layer 3 points here\n")
    (data / "pair1").write_text("hardlinked in one layer\n")
    os.link(data / "pair1", data / "pair2")
    (data / "link").symlink_to("../etc/motd")
    (data / "abs").symlink_to("/etc/passwd")
    (data / "xattr.txt").write_text("has xattrs\n")
    os.setxattr(data / "xattr.txt", "user.image.note", b"value-1")
    os.setxattr(data / "xattr.txt", "user.other", b"\x00\x01binary")
    su = data / "setuid"
    su.write_bytes(b"#!/bin/sh\n")
    os.chown(su, 0, 0)
    su.chmod(0o4755)
    sg = data / "setgid-dir"
    sg.mkdir()
    os.chown(sg, 1000, 1000)
    sg.chmod(0o2775)
    (data / "owned").write_text("uid 1000\n")
    os.chown(data / "owned", 1000, 1000, follow_symlinks=False)
    (data / "empty").mkdir()
    os.mkfifo(data / "fifo")
    (rootfs / "was-a-dir").mkdir()
    (rootfs / "was-a-dir" / "inside").write_text("replaced by a file in layer 3\n")
    for p in [data / "target.txt", data / "big.bin", app / "run.sh"]:
        _mtime(p, 1_600_000_000)


def _layer2(rootfs: Path) -> None:
    (rootfs / "old" / "gone.txt").unlink()
    (rootfs / "etc" / "removed.conf").unlink()
    (rootfs / "etc" / "motd").write_text("second motd\n")
    (rootfs / "layer2.txt").write_text("added by layer 2\n")
    (rootfs / "home" / "app").mkdir(parents=True)
    os.chown(rootfs / "home" / "app", 1000, 1000)


def _tar_layer3() -> bytes:
    """What umoci cannot write: an opaque directory, a hardlink to a lower layer's
    file, a file over a directory, a whiteout then the same name again."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:

        def add(name: str, kind: bytes, data: bytes = b"", link: str = "", mode: int = 0o644) -> None:
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode, ti.mtime, ti.linkname = kind, mode, 1_700_000_000, link
            ti.uid = ti.gid = 0
            if kind == tarfile.REGTYPE:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            else:
                tf.addfile(ti)

        add("old/", tarfile.DIRTYPE, mode=0o750)
        add("old/.wh..wh..opq", tarfile.REGTYPE)
        add("old/new.txt", tarfile.REGTYPE, b"only this is left in old/\n")
        add("data/", tarfile.DIRTYPE, mode=0o755)
        add("data/hardlink-to-lower", tarfile.LNKTYPE, link="data/target.txt")
        add("was-a-dir", tarfile.REGTYPE, b"a file where a directory was\n")
        add("layer2.txt", tarfile.REGTYPE, b"replaced in layer 3\n", mode=0o600)
        add("data/.wh.pair2", tarfile.REGTYPE)
    return buf.getvalue()


def umoci_base(layout: Path, bundle: Path) -> tuple[Path, Path]:
    """An empty OCI layout (tag `base`, no layers) and its bundle unpacked at `bundle`,
    to fill bundle/rootfs and repack as the first layer."""
    run("umoci", "init", "--layout", layout)
    run("umoci", "new", "--image", f"{layout}:base")
    run("umoci", "unpack", "--image", f"{layout}:base", bundle)
    return layout, bundle


def build_sample(work: Path) -> Path:
    """The sample image as an OCI layout at work/sample (tag v1)."""
    layout, bundle = umoci_base(work / "sample", work / "bundle")
    _layer1(bundle / "rootfs")
    run("umoci", "repack", "--image", f"{layout}:l1", bundle)
    shutil.rmtree(bundle)
    run("umoci", "unpack", "--image", f"{layout}:l1", bundle)
    _layer2(bundle / "rootfs")
    run("umoci", "repack", "--image", f"{layout}:l2", bundle)
    shutil.rmtree(bundle)
    raw = work / "layer3.tar"
    raw.write_bytes(_tar_layer3())
    run("umoci", "raw", "add-layer", "--image", f"{layout}:l2", "--tag", "l3", raw)
    run(
        "umoci",
        "config",
        "--image",
        f"{layout}:l3",
        "--tag",
        "v1",
        "--config.entrypoint",
        "/bin/sh",
        "--config.entrypoint",
        "/app/run.sh",
        "--config.cmd",
        "one",
        "--config.cmd",
        "two",
        "--config.env",
        f"GREETING={GREETING}",
        "--config.env",
        "PATH=/bin",
        "--config.workingdir",
        "/data",
        "--config.user",
        "0:0",
        "--config.label",
        "org.example.name=sample",
        "--architecture",
        "amd64",
        "--os",
        "linux",
    )
    return layout


# -- variants written here: other compressions, a multi-platform index -------------------


def _blob(layout: Path, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def read_blob(layout: Path, digest: str) -> bytes:
    return (layout / "blobs" / "sha256" / digest.split(":")[1]).read_bytes()


def tagged(layout: Path, tag: str) -> dict[str, Any]:
    index = json.loads((layout / "index.json").read_text())
    (desc,) = [m for m in index["manifests"] if m.get("annotations", {}).get(REF) == tag]
    return dict(desc)


REF = "org.opencontainers.image.ref.name"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"


def add_tag(layout: Path, tag: str, desc: dict[str, Any]) -> None:
    index = json.loads((layout / "index.json").read_text())
    index["manifests"] = [m for m in index["manifests"] if m.get("annotations", {}).get(REF) != tag]
    index["manifests"].append({**desc, "annotations": {REF: tag}})
    (layout / "index.json").write_text(json.dumps(index))


def write_manifest(layout: Path, manifest: dict[str, Any], tag: str) -> dict[str, Any]:
    desc = {"mediaType": MANIFEST, **_blob(layout, json.dumps(manifest).encode())}
    add_tag(layout, tag, desc)
    return desc


Recompress = Callable[[bytes], tuple[bytes, str]]
RECOMPRESS: dict[str, Recompress] = {
    "zstd": lambda t: (zstandard.ZstdCompressor(level=3).compress(t), LAYER + "+zstd"),
    "plain": lambda t: (t, LAYER),
    "gzip": lambda t: (gzip.compress(t, 6), LAYER + "+gzip"),
}


def recompressed(layout: Path, tag: str, how: str, new_tag: str) -> dict[str, Any]:
    """The image `tag` again with its layers stored as `how` (zstd, plain or gzip)."""
    manifest = json.loads(read_blob(layout, tagged(layout, tag)["digest"]))
    layers = []
    for d in manifest["layers"]:
        tar = gzip.decompress(read_blob(layout, d["digest"]))
        data, media = RECOMPRESS[how](tar)
        layers.append({"mediaType": media, **_blob(layout, data)})
    return write_manifest(layout, {**manifest, "layers": layers}, new_tag)


def multi_platform(layout: Path, tag: str, new_tag: str) -> dict[str, Any]:
    """An index of `tag` as linux/amd64 and a one-layer image claiming linux/arm64/v8."""
    amd64 = tagged(layout, tag)
    manifest = json.loads(read_blob(layout, amd64["digest"]))
    config = json.loads(read_blob(layout, manifest["config"]["digest"]))
    config = {**config, "architecture": "arm64", "variant": "v8"}
    config["rootfs"] = {**config["rootfs"], "diff_ids": config["rootfs"]["diff_ids"][:1]}
    config["config"] = {**config["config"], "Cmd": ["arm"]}
    arm = {
        **manifest,
        "config": {**manifest["config"], **_blob(layout, json.dumps(config).encode())},
        "layers": manifest["layers"][:1],
    }
    arm_desc = {
        "mediaType": MANIFEST,
        **_blob(layout, json.dumps(arm).encode()),
        "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"},
    }
    amd_desc = {
        "mediaType": MANIFEST,
        "digest": amd64["digest"],
        "size": amd64["size"],
        "platform": {"os": "linux", "architecture": "amd64"},
    }
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [arm_desc, amd_desc]}
    desc = {"mediaType": INDEX, **_blob(layout, json.dumps(index).encode())}
    add_tag(layout, new_tag, desc)
    return desc


def docker_archive(layout: Path, tag: str, out: Path) -> Path:
    run("skopeo", "copy", "--quiet", f"oci:{layout}:{tag}", f"docker-archive:{out}:sample:{tag}")
    return out


def umoci_unpack(layout: Path, tag: str, bundle: Path) -> Path:
    """`umoci unpack` of the image: the tree casfs must give. Its rootfs."""
    run("umoci", "unpack", "--image", f"{layout}:{tag}", bundle)
    return bundle / "rootfs"


# -- a Debian rootfs: real files of this host --------------------------------------------

DEBIAN_TREES = ("/etc", "/usr/lib/python3.11")


def build_debian(work: Path, trees: Iterable[str] = DEBIAN_TREES, tag: str = "debian") -> Path:
    """An image of copies of host subtrees (one umoci layer), plus a small second layer
    that deletes a directory and replaces a file: its layout at work/debian."""
    layout, bundle = umoci_base(work / "debian", work / "debian-bundle")
    rootfs = bundle / "rootfs"
    for t in trees:
        dest = rootfs / t.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        run("cp", "-a", t, dest)  # (keeps modes, owners, times, xattrs, hardlinks)
    run("umoci", "repack", "--image", f"{layout}:{tag}-base", bundle)
    shutil.rmtree(bundle)
    run("umoci", "unpack", "--image", f"{layout}:{tag}-base", bundle)
    shutil.rmtree(rootfs / "etc" / "apt", ignore_errors=True)
    (rootfs / "etc" / "hostname").write_text("casfs-debian\n")
    run("umoci", "repack", "--image", f"{layout}:{tag}", bundle)
    shutil.rmtree(bundle)
    return layout


# -- images written whole here (hostile ones) -----------------------------------------------


def new_layout(layout: Path) -> Path:
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text('{"schemaVersion": 2, "manifests": []}')
    return layout


def write_image(layout: Path, tars: list[bytes], tag: str, **config: Any) -> dict[str, Any]:
    """An image of these uncompressed layer tars (gzip-compressed here) under `tag`."""
    layers = [{"mediaType": LAYER + "+gzip", **_blob(layout, gzip.compress(t, 1))} for t in tars]
    diff_ids = [f"sha256:{hashlib.sha256(t).hexdigest()}" for t in tars]
    doc = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    cfg = {"mediaType": "application/vnd.oci.image.config.v1+json", **_blob(layout, json.dumps(doc).encode())}
    return write_manifest(layout, {"schemaVersion": 2, "config": cfg, "layers": layers}, tag)


def tar_of(*entries: tuple[str, bytes, str]) -> bytes:
    """A layer tar of (name, type, data or link target) entries."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, arg in entries:
            ti = tarfile.TarInfo(name)
            ti.type, ti.mtime = kind, 1_700_000_000
            ti.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
            if kind == tarfile.REGTYPE:
                ti.size = len(arg)
                tf.addfile(ti, io.BytesIO(arg.encode()))
                continue
            ti.linkname = arg
            tf.addfile(ti)
    return buf.getvalue()
