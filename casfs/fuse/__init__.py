"""The FUSE edge of casfs: a thin pyfuse3 adapter over the views in casfs.vfs.

    inodes.py      (view, inode) <-> FUSE inode numbers; lookup counts and forget
    operations.py  the pyfuse3.Operations adapter: translate, call a view, map errors
    control.py     the user.casfs.* xattr control plane, as a table
    daemon.py      casfs mount / umount: the daemon's lifetime, signals, run files

The concurrency protocol (who owns what, which locks, what runs in threads) is stated
once, in docs/developer-notes.md, "Concurrency protocol of the daemon".
"""
