"""Compare two directory trees entry by entry: every attribute an export must keep.

All entries are lstat-ed before any is read (reading changes atimes), files are read
with O_NOATIME, and hardlinks are compared as groups of paths.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Collection
from pathlib import Path

Snapshot = dict[bytes, dict[str, object]]


def snapshot(top: Path, ignore: Collection[str] = ()) -> Snapshot:
    root = os.fsencode(top)
    stats: dict[bytes, os.stat_result] = {b"": os.lstat(root)}
    todo = [b""]
    while todo:
        rel = todo.pop()
        fd = os.open(root + b"/" + rel if rel else root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOATIME)
        try:
            names = [os.fsencode(n) for n in os.listdir(fd)]
        finally:
            os.close(fd)
        for name in names:
            path = rel + b"/" + name if rel else name
            st = stats[path] = os.lstat(root + b"/" + path)
            if stat.S_ISDIR(st.st_mode):
                todo.append(path)
    groups: dict[tuple[int, int], bytes] = {}
    for path in sorted(stats):
        st = stats[path]
        if not stat.S_ISDIR(st.st_mode):
            groups.setdefault((st.st_dev, st.st_ino), path)
    out: Snapshot = {}
    for path, st in stats.items():
        full = root + b"/" + path if path else root
        d: dict[str, object] = {
            "type": stat.S_IFMT(st.st_mode),
            "mode": stat.S_IMODE(st.st_mode),
            "uid": st.st_uid,
            "gid": st.st_gid,
            "mtime": st.st_mtime_ns,
            "atime": st.st_atime_ns,
            "nlink": st.st_nlink,
            "xattrs": sorted((n, os.getxattr(full, n, follow_symlinks=False)) for n in _listxattr(full)),
        }
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            d["rdev"] = st.st_rdev
        if stat.S_ISLNK(st.st_mode):
            d["target"] = os.readlink(full)
            del d["mode"]  # always 0777, and Linux cannot change it
        if stat.S_ISREG(st.st_mode):
            d["size"] = st.st_size
            d["sha256"] = _digest(full)
        if not stat.S_ISDIR(st.st_mode):
            d["hardlink_group"] = groups[(st.st_dev, st.st_ino)]
        for key in ignore:
            d.pop(key, None)
        out[path] = d
    return out


def compare(a: Path, b: Path, ignore: Collection[str] = ()) -> list[str]:
    """Differences between two trees, as readable lines; empty when they match."""
    sa, sb = snapshot(a, ignore), snapshot(b, ignore)
    diffs = [f"only in {a}: {p!r}" for p in sorted(sa.keys() - sb.keys())]
    diffs += [f"only in {b}: {p!r}" for p in sorted(sb.keys() - sa.keys())]
    for p in sorted(sa.keys() & sb.keys()):
        for key in sorted(sa[p].keys() | sb[p].keys()):
            va, vb = sa[p].get(key), sb[p].get(key)
            if va != vb:
                diffs.append(f"{p!r} {key}: {va!r} != {vb!r}")
    return diffs


def _listxattr(path: bytes) -> list[str]:
    return os.listxattr(path, follow_symlinks=False)


def _digest(path: bytes) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOATIME)
    try:
        while data := os.read(fd, 1 << 20):
            h.update(data)
    finally:
        os.close(fd)
    return h.hexdigest()
