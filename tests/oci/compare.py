"""Trees compared the way a container sees them: for every path, its type, mode, owner,
size, content digest, link target, mtime, xattrs; and which paths share an inode."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

CONTROL = "user.casfs."  # the mount's own control names, not the image's


def manifest(top: Path, root_attrs: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    inodes: dict[tuple[int, int], list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, top)
            st = os.lstat(full)
            out[rel] = describe(full, st)
            if not stat.S_ISDIR(st.st_mode):
                inodes.setdefault((st.st_dev, st.st_ino), []).append(rel)
    if root_attrs:
        out["."] = describe(str(top), os.lstat(top))
    out["[hardlinks]"] = sorted(sorted(v) for v in inodes.values() if len(v) > 1)
    return out


def describe(path: str, st: os.stat_result) -> tuple[Any, ...]:
    mode = st.st_mode
    content = None
    if stat.S_ISREG(mode):
        with open(path, "rb") as f:
            content = hashlib.sha256(f.read()).hexdigest()
    elif stat.S_ISLNK(mode):
        content = os.readlink(path)
    size = st.st_size if not stat.S_ISDIR(mode) else None
    return (stat.filemode(mode), st.st_uid, st.st_gid, size, content, st.st_mtime_ns, xattrs(path))


def xattrs(path: str) -> tuple[tuple[str, bytes], ...]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return ()
    got = []
    for n in sorted(names):
        if n.startswith(CONTROL):
            continue
        try:
            got.append((n, os.getxattr(path, n, follow_symlinks=False)))
        except OSError:
            continue
    return tuple(got)


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            out.append(f"{k}: {a.get(k)} != {b.get(k)}")
    return out
