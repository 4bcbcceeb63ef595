"""The FUSE edge of casfs: a thin pyfuse3 adapter over the views in casfs.vfs.

    inodes.py      (view, inode) <-> FUSE inode numbers; lookup counts and forget
    operations.py  the pyfuse3.Operations adapter: translate, call a view, map errors
    control.py     the user.casfs.* xattr control plane, as a table
    daemon.py      casfs mount / umount: the daemon's lifetime, signals, run files

Concurrency protocol: the trio thread owns the views, the inode table, the handles and
the chunk cache's bookkeeping. Worker threads do the blocking work: blob reads
(ChunkCache.fetch), digests, usage walks, catalog writes (one CatalogWriter, one
thread at a time) and syncfs. No lock is held across an await.
"""
