"""File capabilities (`security.capability`) on a `--suid` casfs mount work as on ext4:
an image keeps them from its source and an exec of the file gets them, a volume stores
what setcap sets, and a write to the file clears them. Without --suid (the default, as
every FUSE mount) neither they nor setuid bits take effect. A copy of /bin/cat run as
nobody shows them in its own /proc/self/status (CapPrm, and Uid for setuid)."""

from __future__ import annotations

import errno
import os
import shutil
import struct
from pathlib import Path

import pytest

from casfs import images, volumes
from casfs.repo import Repository
from tests.helpers.mount import as_nobody, mounted, public_dir

CAP = "security.capability"
CAP_NET_RAW = 13


def caps(*numbers: int) -> bytes:
    """A vfs_cap_data (revision 2, effective) permitting `numbers`, as setcap writes it."""
    permitted = sum(1 << n for n in numbers)
    return struct.pack("<5I", 0x02000001, permitted & 0xFFFFFFFF, 0, permitted >> 32, 0)


def permitted_at_exec(cat: Path) -> int:
    """CapPrm of `cat /proc/self/status` run as nobody (who has no capabilities of his own)."""
    done = as_nobody(cat, "/proc/self/status")
    assert done.returncode == 0, done.stderr
    (line,) = (s for s in done.stdout.splitlines() if s.startswith("CapPrm:"))
    return int(line.split()[1], 16)


def test_a_volumes_file_capabilities_are_stored_and_a_write_clears_them(
    repo: Repository, tmp_path: Path
) -> None:
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    with (
        public_dir() as pub,
        mounted(repo.path, pub / "mnt", volume="v", extra=["--allow-other", "--suid"]) as m,
    ):
        os.chmod(m.path, 0o755)
        cat = m.path / "cat"
        shutil.copy2("/bin/cat", cat)
        os.setxattr(cat, CAP, caps(CAP_NET_RAW))
        assert os.getxattr(cat, CAP) == caps(CAP_NET_RAW)
        assert permitted_at_exec(cat) == 1 << CAP_NET_RAW
        with open(cat, "ab") as f:  # (root's write too: capabilities go, as on ext4)
            f.write(b"\0")
        with pytest.raises(OSError) as e:
            os.getxattr(cat, CAP)
        assert e.value.errno == errno.ENODATA
        assert permitted_at_exec(cat) == 0
    with mounted(repo.path, tmp_path / "again", volume="v") as m:  # (and so it was stored)
        assert CAP not in os.listxattr(m.path / "cat")


def test_an_images_capabilities_and_setuid_take_effect_with_suid_only(
    repo: Repository, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy2("/bin/cat", src / "cat")
    os.setxattr(src / "cat", CAP, caps(CAP_NET_RAW))  # (setcap cap_net_raw+ep)
    shutil.copy2("/bin/cat", src / "setuid")
    os.chmod(src / "setuid", 0o4755)  # (root's)
    images.import_image(repo, "tools", src)
    for suid in (False, True):
        extra = ["--allow-other", "--suid"] if suid else ["--allow-other"]
        with public_dir() as pub, mounted(repo.path, pub / "mnt", extra=extra) as m:
            tools = m.path / "images" / "tools"
            assert os.getxattr(tools / "cat", CAP) == caps(CAP_NET_RAW)  # (stored either way)
            assert CAP in os.listxattr(tools / "cat")
            with pytest.raises(OSError) as e:
                os.getxattr(tools / "setuid", CAP)
            assert e.value.errno == errno.ENODATA
            assert permitted_at_exec(tools / "cat") == (1 << CAP_NET_RAW if suid else 0)
            done = as_nobody(tools / "setuid", "/proc/self/status")
            assert done.returncode == 0, done.stderr
            (uids,) = (s.split()[1:] for s in done.stdout.splitlines() if s.startswith("Uid:"))
            assert uids[1] == ("0" if suid else "65534")  # (the effective uid)
