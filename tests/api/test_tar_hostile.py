"""Hostile, truncated and corrupt tar archives: each is refused with a clear error, and
the store is left exactly as it was (no blob files, no staging files)."""

from __future__ import annotations

import gzip
import io
import os
import tarfile

import pytest
import zstandard

from casfs.errors import CasfsError, HostileArchive, UsageError
from casfs.importers.tarball import import_tar
from casfs.repo import Repository
from casfs.snapshots.tree import Tree
from casfs.store.ids import BlobId
from tests.helpers.blobs import stored_files

pytestmark = pytest.mark.no_fsck(
    "content is imported through the importers alone: its roots are in no image row, "
    "so fsck finds every reference one too many"
)

CHUNK = 65536
FIRST = os.urandom(3 * CHUNK + 17)  # a valid member first, so blobs are staged before the refusal


def tar(*members: tuple[str, bytes, str], gnu: bool = False) -> bytes:
    """Members as (name, type, data-or-linkname); a valid file always comes first."""
    buf = io.BytesIO()
    fmt = tarfile.GNU_FORMAT if gnu else tarfile.PAX_FORMAT
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        _member(tf, "ok/first.bin", tarfile.REGTYPE, FIRST)
        for name, kind, arg in members:
            _member(tf, name, kind, arg.encode())
    return buf.getvalue()


def _member(tf: tarfile.TarFile, name: str, kind: bytes, arg: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    if kind in (tarfile.REGTYPE, tarfile.AREGTYPE):
        ti.size = len(arg)
        tf.addfile(ti, io.BytesIO(arg))
        return
    if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        ti.linkname = arg.decode()
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        ti.devmajor, ti.devminor = 1, 3
    tf.addfile(ti)


def store_files(repo: Repository) -> list[str]:
    return stored_files(repo.path)


def refused(repo: Repository, data: bytes, error: type[CasfsError], match: str) -> None:
    with repo.batch() as b, pytest.raises(error, match=match):
        import_tar(b, io.BytesIO(data), CHUNK)
    assert store_files(repo) == []


REG, DIR, SYM, LNK, CHR, BLK = (
    tarfile.REGTYPE,
    tarfile.DIRTYPE,
    tarfile.SYMTYPE,
    tarfile.LNKTYPE,
    tarfile.CHRTYPE,
    tarfile.BLKTYPE,
)


@pytest.mark.parametrize(
    ("members", "match"),
    [
        ([("/etc/passwd", REG, "x")], r"'/etc/passwd' refused: absolute path"),
        ([("../x", REG, "x")], r"'../x' refused: '..' in a path"),
        ([("a/../../x", REG, "x")], r"'a/../../x' refused: '..' in a path"),
        ([("./a/../b", REG, "x")], r"'./a/../b' refused: '..' in a path"),
        (
            [("link", SYM, "/etc"), ("link/passwd", REG, "pwned")],
            r"'link/passwd' refused: .*link is a symlink",
        ),
        ([("d/up", SYM, "../../etc"), ("d/up/passwd", REG, "x")], r"'d/up/passwd' refused: .*symlink"),
        ([("d/up", SYM, "../../etc")], r"'d/up' refused: symlink to '../../etc' leaves the root"),
        ([("d/e/up", SYM, "../x/../../../y")], r"'d/e/up' refused: symlink .* leaves the root"),
        # each link stays inside on its own; following one through the other leaves the root
        ([("here", SYM, "."), ("d/x", SYM, "../here/..")], r"'d/x' refused: symlink .* leaves the root"),
        ([("abs", SYM, "/../../etc")], r"'abs' refused: symlink .* leaves the root"),
        ([("h", LNK, "../outside")], r"'h' refused: '..' in a path \(link target '../outside'\)"),
        ([("h", LNK, "/etc/shadow")], r"'h' refused: absolute path \(link target"),
        (
            [("h", LNK, "later"), ("later", REG, "x")],
            r"'h' refused: hardlink to 'later', which is not an earlier",
        ),
        ([("h", LNK, "ok")], r"'h' refused: hardlink to 'ok'"),  # a directory
        ([("f", REG, "x"), ("f/g", REG, "y")], r"'f/g' refused: .*parent f is not a directory"),
        ([("ok", REG, "x")], r"'ok' refused: .*replace a directory that has entries"),
        ([("null", CHR, "")], r"'null' refused: device nodes are not allowed"),
        ([("sda", BLK, "")], r"'sda' refused: device nodes are not allowed"),
        ([("n" * 256, REG, "")], r"refused: a name longer than 255 bytes"),
        ([("vol", b"V", "")], r"'vol' refused: unsupported member type"),
    ],
)
def test_hostile_members_are_refused(
    repo: Repository, members: list[tuple[str, bytes, str]], match: str
) -> None:
    refused(repo, tar(*members), HostileArchive, match)


def test_devices_are_kept_when_allowed(repo: Repository) -> None:
    with repo.batch() as b:
        built = import_tar(b, io.BytesIO(tar(("dev/null", CHR, ""))), CHUNK, allow_devices=True)
        b.commit({built.root: 1})
    assert store_files(repo) != []


def test_symlinks_that_stay_inside_are_kept(repo: Repository) -> None:
    data = tar(
        ("bin", SYM, "usr/bin"),
        ("etc/localtime", SYM, "/usr/share/zoneinfo/UTC"),  # absolute: seen from the image's root
        ("usr/lib/x", SYM, "../../etc/../usr"),
        ("dangling", SYM, "no/such/thing"),
    )
    with repo.batch() as b:
        built = import_tar(b, io.BytesIO(data), CHUNK)
        b.commit({built.root: 1})
    assert symlinks(repo, built.root) == {
        b"bin": b"usr/bin",
        b"etc/localtime": b"/usr/share/zoneinfo/UTC",
        b"usr/lib/x": b"../../etc/../usr",
        b"dangling": b"no/such/thing",
    }


def symlinks(repo: Repository, root: BlobId, prefix: bytes = b"") -> dict[bytes, bytes]:
    """Every symlink of an imported tree: its path and target, as stored."""
    found: dict[bytes, bytes] = {}
    for entry in Tree.decode(repo.get_meta(root)).entries:
        if entry.is_dir:
            found |= symlinks(repo, entry.blob, prefix + entry.name + b"/")
        elif entry.is_symlink:
            found[prefix + entry.name] = entry.data
    return found


def valid_tar() -> bytes:
    return tar(("b/second.bin", REG, "x" * 100_000), ("c", SYM, "b/second.bin"))


def test_truncated_inside_a_member_is_refused(repo: Repository) -> None:
    data = valid_tar()
    refused(repo, data[: len(data) // 2], UsageError, "tar archive is truncated")


def test_truncated_between_members_is_refused(repo: Repository) -> None:
    # tarfile alone takes a stream that stops at a header boundary for a complete archive
    data = valid_tar()
    cut = 512 + len(FIRST) + (-len(FIRST) % 512)  # the first member's header and data
    assert data[cut : cut + 512] != bytes(512)
    refused(repo, data[:cut], UsageError, "tar archive is truncated: it ends at byte")


def test_truncated_inside_a_header_is_refused(repo: Repository) -> None:
    data = tar(gnu=True)
    cut = 512 + len(FIRST) + (-len(FIRST) % 512) + 100
    refused(repo, data[:cut], UsageError, "tar archive is truncated")


def test_garbage_is_refused(repo: Repository) -> None:
    refused(repo, os.urandom(10_000), UsageError, "tar archive is corrupt")
    refused(repo, b"", UsageError, "not a tar archive: the stream is empty")


def test_garbage_after_a_member_is_refused(repo: Repository) -> None:
    data = tar(gnu=True)
    end = 512 + len(FIRST) + (-len(FIRST) % 512)
    refused(repo, data[:end] + os.urandom(2048), UsageError, "tar archive is corrupt")


def test_truncated_gzip_is_refused(repo: Repository) -> None:
    packed = gzip.compress(valid_tar())
    refused(repo, packed[: len(packed) - 100], UsageError, "tar archive is truncated")
    refused(repo, packed[: len(packed) // 2], UsageError, "tar archive is truncated")


def test_corrupt_gzip_is_refused(repo: Repository) -> None:
    packed = bytearray(gzip.compress(valid_tar()))
    packed[len(packed) // 2] ^= 0xFF
    refused(repo, bytes(packed), UsageError, "tar archive is (corrupt|truncated)")


def test_truncated_zstd_is_refused(repo: Repository) -> None:
    packed = zstandard.ZstdCompressor().compress(valid_tar())
    refused(repo, packed[: len(packed) // 2], UsageError, "tar archive is truncated")
    # cut inside the frame's end, after every tar byte decompressed: still refused
    refused(repo, packed[:-3], UsageError, "tar archive is truncated")


def test_other_compression_is_refused_by_name(repo: Repository) -> None:
    lz4 = b"\x04\x22\x4d\x18" + bytes(100)
    refused(repo, lz4, UsageError, "lz4-compressed tar archives are not supported")


def test_corrupt_bzip2_and_xz_are_refused(repo: Repository) -> None:
    refused(repo, b"BZh91AY&SY" + bytes(100), UsageError, "tar archive is corrupt")
    refused(repo, b"\xfd7zXZ\x00" + bytes(100), UsageError, "tar archive is corrupt")
