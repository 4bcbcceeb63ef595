"""The FUSE edge of casfs: a thin pyfuse3 adapter over the views in casfs.vfs.

    inodes.py      (view, inode) <-> FUSE inode numbers; lookup counts and forget
    operations.py  the pyfuse3.Operations adapter: translate, call a view, map errors
    control.py     the user.casfs.* xattr control plane, as a table (no SQL: it asks
                   casfs.volumes, casfs.images and casfs.refcount.accounts)
    daemon.py      serve(cfg): the mounted daemon's lifetime (exit stack, nursery, signals)
    launcher.py    starting the daemon (ready pipe), its run files, `casfs umount`
    mountinfo.py   /proc/self/mountinfo: what is mounted where, without a stat

daemon imports launcher, never the other way: the launcher imports neither trio nor
pyfuse3, and a foreground mount is handed the daemon's run_daemon by casfs.cli.mounts.

The concurrency protocol (who owns what, which locks, what runs in threads) is stated
once, in docs/concurrency.md.
"""
