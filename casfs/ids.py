"""The numbers every layer names, as distinct types so that one is never passed for
another (blob ids are casfs.store.ids.BlobId, the kernel's inode numbers
casfs.fuse.inodes.FuseIno).

Each is an int at run time: converted at the edges (a catalog row, a FUSE request, a
command-line argument) with the type's call, and plain int arithmetic inside.

A leaf module (it imports nothing of casfs), so that every layer may name these.
"""

from __future__ import annotations

from typing import NewType

# An inode number inside one view (an image's tree, a volume's overlay): 1 is the root;
# a tree's entries and the overlay_inodes rows carry them.
InodeNo = NewType("InodeNo", int)
# Chunk n of a file or disk: bytes [n*chunk_size, (n+1)*chunk_size).
ChunkNo = NewType("ChunkNo", int)
# A volume's snapshot n (VOL@N): numbered from 1 per volume.
SnapshotNo = NewType("SnapshotNo", int)

NO_INO = InodeNo(0)  # none: an inode not numbered yet, or the root's parent
ROOT_INO = InodeNo(1)  # a tree's root directory; a disk's one file
FIRST_FREE_INO = InodeNo(2)  # a catalog row's next_ino when only the root is taken
