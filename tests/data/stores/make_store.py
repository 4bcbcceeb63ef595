"""Build a store with OLD casfs code, for the upgrade test (see README.md here).

Run with the old code first on the path (this file imports only the standard library,
and casfs only from format 1's Python API):

    PYTHONPATH=/tmp/old-N python tests/data/stores/make_store.py N OUT WORK

It fills OUT/store through the CLI of that code (format 1 had no CLI: its Python API)
and writes OUT/expected.json: for every image, volume and snapshot, the manifest of its
content (as the old code exports it, or as imported where it could not export), and
the overlay file a killed mount left behind (formats >= 2), and what a killed block
mount wrote (formats >= 6).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

OVERLAY_FILE = "written-before-kill.txt"
OVERLAY_TEXT = b"written by a mount that was killed with SIGKILL\n"
CHUNK = 64 << 10


def make_sources(work: Path) -> tuple[Path, Path]:
    """A small directory tree and a small raw disk image, the same every time."""
    tree = work / "tree"
    (tree / "sub" / "deeper").mkdir(parents=True)
    (tree / "hello.txt").write_bytes(b"hello, old store\n")
    (tree / "sub" / "data.bin").write_bytes(bytes(range(256)) * 300)
    (tree / "sub" / "deeper" / "empty").write_bytes(b"")
    (tree / "exec.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    (tree / "exec.sh").chmod(0o755)
    os.symlink("hello.txt", tree / "link")
    os.link(tree / "hello.txt", tree / "sub" / "hardlink.txt")
    raw = work / "disk.img"
    block = hashlib.sha256(b"casfs").digest() * 2048  # 64 KiB, not compressible to nothing
    raw.write_bytes(block + bytes(128 << 10) + block[::-1])
    return tree, raw


def manifest(path: Path) -> Any:
    """What a directory or a raw file holds: {relative path: [type, mode, sha256|target]}."""
    if path.is_file():
        return {"": ["raw", 0, hashlib.sha256(path.read_bytes()).hexdigest()]}
    out: dict[str, list[Any]] = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = Path(root, name)
            rel = str(p.relative_to(path))
            st = p.lstat()
            if p.is_symlink():
                out[rel] = ["link", 0, os.readlink(p)]
            elif p.is_dir():
                out[rel] = ["dir", st.st_mode & 0o7777, ""]
            else:
                out[rel] = ["file", st.st_mode & 0o7777, hashlib.sha256(p.read_bytes()).hexdigest()]
    return out


def casfs(store: Path, *args: str) -> str:
    cmd = [sys.executable, "-m", "casfs", "-s", str(store), *args]
    # cwd elsewhere: `python -m` puts the working directory first on the path.
    return subprocess.run(cmd, check=True, capture_output=True, text=True, cwd="/").stdout


def build_cli(version: int, store: Path, work: Path) -> dict[str, Any]:
    tree, raw = make_sources(work)
    casfs(store, "init")
    casfs(store, "image", "import", "dirimg", str(tree))
    casfs(store, "image", "import", "rawimg", str(raw))
    casfs(store, "volume", "create", "vdir", "--from", "dirimg")
    casfs(store, "volume", "create", "vraw", "--from", "rawimg")
    casfs(store, "volume", "create", "vblank", "--blank-dir")
    casfs(store, "snapshot", "create", "vdir", "--label", "first")
    casfs(store, "snapshot", "create", "vraw")
    casfs(store, "volume", "create", "vclone", "--from", "vdir@1")
    casfs(store, "snapshot", "create", "vdir")
    expected: dict[str, Any] = {"format": version, "images": {}, "volumes": {}, "snapshots": {}}
    for noun, names in (
        ("image", ["dirimg", "rawimg"]),
        ("volume", ["vdir", "vraw", "vblank", "vclone"]),
        ("snapshot", ["vdir@1", "vdir@2", "vraw@1"]),
    ):
        for name in names:
            dest = work / "export" / name
            dest.parent.mkdir(exist_ok=True)
            casfs(store, noun, "export", name, str(dest))
            expected[f"{noun}s"][name] = manifest(dest)
    # A mount killed with SIGKILL leaves its overlay (saved by fsync) in the catalog.
    mnt = work / "mnt"
    mnt.mkdir()
    with killed_mount(store, mnt, "vdir"):
        fd = os.open(mnt / OVERLAY_FILE, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, OVERLAY_TEXT)
        os.fsync(fd)
        os.close(fd)
        (mnt / "newdir").mkdir()
        dfd = os.open(mnt, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        if version >= 6:  # while vdir's daemon lives (a new daemon recovers a dead one's mount)
            before = (work / "export" / "vraw").read_bytes()
            expected["block_overlay"] = kill_block_mount(store, work, before, version)
    expected["overlay"] = {
        "volume": "vdir",
        "file": OVERLAY_FILE,
        "sha256": hashlib.sha256(OVERLAY_TEXT).hexdigest(),
    }
    return expected


def block_writes() -> list[tuple[int, bytes]]:
    """What the killed block mount writes: a few bytes straddling the first chunk
    boundary (half in data, half in a hole) and one whole chunk in the hole."""
    pattern = hashlib.sha256(b"written to a block volume before SIGKILL").digest() * (CHUNK // 32)
    return [(CHUNK - 1000, pattern[:3000]), (2 * CHUNK, pattern[::-1])]


def kill_block_mount(store: Path, work: Path, before: bytes, version: int) -> dict[str, Any]:
    """Mount `vraw` on a file, write and fsync, SIGKILL: format 6 left the written
    chunks as overlay_chunks rows, the old form of a block volume's overlay; format 7
    an upper file (an `uppers` row and STORE/upper/vraw/)."""
    disk = bytearray(before)
    mnt = work / "vraw.img"
    mnt.touch()
    with killed_mount(store, mnt, "vraw"):
        fd = os.open(mnt, os.O_WRONLY)
        for offset, data in block_writes():
            os.pwrite(fd, data, offset)
            disk[offset : offset + len(data)] = data
        os.fsync(fd)
        os.close(fd)
    conn = sqlite3.connect(store / "catalog.db")
    form = "rows" if version < 7 else "upper"
    table = "overlay_chunks" if form == "rows" else "uppers"
    (rows,) = conn.execute(f"SELECT count(*) FROM {table} WHERE volume = 'vraw'").fetchone()
    conn.close()
    if rows < (3 if form == "rows" else 1):  # chunks 0, 1 and 2 were written
        raise RuntimeError(f"the killed block mount left {rows} {table} rows")
    return {
        "volume": "vraw",
        "form": form,
        "writes": [[o, len(d), hashlib.sha256(d).hexdigest()] for o, d in block_writes()],
        "size": len(disk),
        "sha256": hashlib.sha256(disk).hexdigest(),
    }


@contextlib.contextmanager
def killed_mount(store: Path, mnt: Path, volume: str) -> Iterator[None]:
    """Mount `volume` read/write on `mnt` with the old daemon, yield, then SIGKILL the
    daemon and remove the mount: the store keeps the volume mounted by a dead pid."""
    cmd = [sys.executable, "-m", "casfs", "-s", str(store), "mount", str(mnt), "--volume", volume]
    daemon = subprocess.Popen(
        [*cmd, "--foreground"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/"
    )
    try:
        deadline = time.monotonic() + 30
        # A mount point, directory or file, is on another device than its directory.
        while os.stat(mnt).st_dev == os.stat(mnt.parent).st_dev:
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise RuntimeError("the old daemon did not mount")
            time.sleep(0.05)
        yield
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        if subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True).returncode:
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


def build_format_1(store: Path, work: Path) -> dict[str, Any]:
    """Format 1 had no CLI and no directory import: its Python API, a raw image."""
    from casfs import images, volumes
    from casfs.repo import Repository

    _, raw = make_sources(work)
    repo = Repository.init(store)
    images.import_image(repo, "rawimg", raw)
    volumes.create_volume(repo, "vraw", volumes.Source(image="rawimg"))
    volumes.create_volume(repo, "vblank", volumes.Source(blank_dir=True))
    volumes.create_volume(repo, "vblock", volumes.Source(blank_block=1 << 20))
    volumes.create_snapshot(repo, "vraw", "first")
    volumes.create_volume(repo, "vclone", volumes.Source(snapshot="vraw@1"))
    repo.close()
    m = manifest(raw)
    zero = {"": ["raw", 0, hashlib.sha256(bytes(1 << 20)).hexdigest()]}
    return {
        "format": 1,
        "images": {"rawimg": m},
        "volumes": {"vraw": m, "vclone": m, "vblock": zero, "vblank": None},
        "snapshots": {"vraw@1": m},
    }


def main() -> None:
    version, out, work = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    work.mkdir(parents=True)
    store = out / "store"
    expected = build_format_1(store, work) if version == 1 else build_cli(version, store, work)
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
