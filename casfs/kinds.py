"""What a blob is and what a volume or image holds: the kinds every layer names (the
catalog stores their values, so the values never change).

A leaf module (it imports nothing of casfs), so that the store, the snapshot formats
and the catalog may all name these types.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class BlobKind(IntEnum):
    """A blob's format (casfs.snapshots.children says what each kind's blob references);
    the blobs table's `kind` column holds the value."""

    DATA = 0  # file or disk bytes: no children
    MAP_ROOT = 1  # chunk-map root: chunk ids or page ids
    MAP_PAGE = 2  # chunk-map page: chunk ids
    TREE = 3  # directory: subtrees, files' chunk ids or map roots

    @property
    def label(self) -> str:
        """The name reports use ("map-root")."""
        return self.name.lower().replace("_", "-")

    @staticmethod
    def label_of(value: int) -> str:
        """The label of a kind column's value, which a damaged catalog may hold out of range."""
        try:
            return BlobKind(value).label
        except ValueError:
            return f"kind-{value}"


class VolumeKind(StrEnum):
    """What an image or a volume holds: a directory tree or one disk. A StrEnum (not a
    Literal) so that a row read from the catalog is checked when converted, and the
    value prints and serialises as the plain string the catalog, the CLI and --json use."""

    DIR = "dir"
    BLOCK = "block"

    @property
    def default_chunk_size(self) -> int:
        """The chunk size of a new image or blank volume of this kind when none is given.
        A disk is read at random in 4 KiB requests, each of which decodes and hashes its
        whole chunk: 32 KiB chunks served 30% more cold random reads at queue depth 16
        than 64 KiB ones (block_ops, issue 8). A tree's files are read whole, and bigger
        chunks mean fewer blobs and rows."""
        return 32 << 10 if self is VolumeKind.BLOCK else 64 << 10


# A mounted block volume's writes go to one sparse file at their own offsets
# (vfs.overlay.upper), and ext4's largest file is 16 TiB less one 4 KiB block. (A blank
# volume's map is then a root of hole pages: 16 MiB at 32 KiB chunks.)
MAX_BLOCK_SIZE = (16 << 40) - (1 << 20)


def chunk_size_refusal(chunk_size: int) -> str | None:
    """Why `chunk_size` cannot be an image's or a blank volume's chunk size, or None."""
    if 4096 <= chunk_size <= 4 << 20 and chunk_size & (chunk_size - 1) == 0:
        return None
    return "chunk size must be a power of two from 4 KiB to 4 MiB"


def block_size_refusal(size: int) -> str | None:
    """Why a read/write block volume cannot be `size` bytes, or None if it can."""
    if size <= MAX_BLOCK_SIZE:
        return None
    return (
        f"a block volume is at most 16 TiB less 1 MiB ({MAX_BLOCK_SIZE} bytes; its writes are kept "
        f"in one file, and ext4's largest is 16 TiB less 4 KiB), not {size}"
    )
