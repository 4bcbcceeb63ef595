"""Clearing setuid/setgid under FUSE_HANDLE_KILLPRIV_V2, asked for with passthrough.

Without it the kernel asks for `security.capability` before every write to a FUSE file
(file_remove_privs; FUSE has no SB_NOSEC), one round trip per write even when the
kernel writes the upper file itself. With it the kernel marks the superblock SB_NOSEC
(an inode with nothing to clear is not asked again) and leaves the clearing to the
daemon. What the kernel (6.18, fs/fuse/dir.c and file.c) then sends, and what casfs does:

  - a write that must clear (file_remove_privs found a setuid bit, or a setgid bit it
    drops, for a writer without CAP_FSETID): a SETATTR that sets nothing, before the
    write, for a daemon-served write and for the kernel's own passthrough write alike
    (fuse_setattr strips the kill flags and sends what is left). A chown to -1:-1 sends
    the same; Linux clears there too. casfs clears (casfs.vfs.api.without_privileges);
  - a truncate by a writer without CAP_FSETID, a chown of a non-directory: the SETATTR
    carries FATTR_KILL_SUIDGID (SetattrFields.kill_suidgid): cleared with the change;
  - an open with O_TRUNC (atomic O_TRUNC, libfuse's default): FUSE_OPEN_KILL_SUIDGID,
    which libfuse does not pass on. casfs clears where the opener lacks CAP_FSETID,
    read from /proc/PID/status (opener_may_keep); the write flag
    FUSE_WRITE_KILL_SUIDGID is not needed: the empty SETATTR comes first.

Known differences from ext4: setgid without group exec stays when the writer is not
in the file's group (as FUSE did before, fuse_setattr's rule); a setuid file that also
holds file capabilities loses its setuid bit to a privileged writer (the empty SETATTR
does not say which was asked). A stored `security.capability` is answered as stored (in
effect at exec, as on ext4); a write makes the kernel remove it (REMOVEXATTR), and a
clearing here drops it too.
"""

from __future__ import annotations

import os
import stat

import pyfuse3

from casfs.vfs.api import without_privileges

_CAP_FSETID = 4


def granted() -> bool:
    """Whether the kernel left clearing to this daemon at INIT (casfs's pyfuse3)."""
    return bool(getattr(pyfuse3, "killpriv_v2_granted", False))


def asked(fields: pyfuse3.SetattrFields, fh: int | None) -> bool:
    """Whether a SETATTR asks the daemon to clear setuid/setgid (granted() only)."""
    if getattr(fields, "kill_suidgid", False):
        return True
    changes = ("atime", "mtime", "ctime", "mode", "uid", "gid", "size")
    return fh is None and not any(getattr(fields, "update_" + c) for c in changes)


def would_clear(mode: int) -> bool:
    """Whether clearing would change a file of this mode."""
    return not stat.S_ISDIR(mode) and without_privileges(mode) != mode


def opener_may_keep(pid: int) -> bool:
    """Whether the process `pid` has CAP_FSETID (in this daemon's user namespace): it
    keeps set-id bits through an O_TRUNC open. Unknown (gone, another namespace): no."""
    try:
        if os.stat(f"/proc/{pid}/ns/user").st_ino != os.stat("/proc/self/ns/user").st_ino:
            return False
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_FSETID & 1)
    except (OSError, ValueError):
        pass
    return False
