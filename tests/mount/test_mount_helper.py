"""The mount(8) helper, tools/mount.fuse.casfs: `mount -t fuse.casfs STORE:VOLUME MNT -o ro`,
the whole-store form, and fstab lines (through `mount -T FSTAB`, so /etc/fstab is left
alone) really mount, and `umount` ends the daemon. Every mount is unmounted in a
`finally`, by force if need be.

mount(8) looks for the helper in /sbin: scripts/install.sh links it there; when it is
missing this test links it for its own duration. CASFS_BIN makes the helper run the
casfs of the interpreter running the tests."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from casfs.fuse.mountinfo import mounts
from tests.helpers.cli import Completed, env, ok, run
from tests.helpers.mount import cleanup, is_mounted, wait_gone
from tests.helpers.procs import alive

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("casfs.fuse.daemon") is None, reason="casfs.fuse.daemon is not in this tree yet"
)

HELPER = Path(__file__).resolve().parents[2] / "tools" / "mount.fuse.casfs"
INSTALLED = Path("/sbin/mount.fuse.casfs")
CASFS_BIN = Path(sys.executable).parent / "casfs"
TIMEOUT = 60


@pytest.fixture(scope="module")
def helper() -> Iterator[Path]:
    """/sbin/mount.fuse.casfs running this tree's helper script while the module runs:
    the link install.sh made may name another checkout's (a different version, or one
    since deleted, as a CI clone is). As root a missing or different link is made or
    redirected for the module, and put back as it was afterwards."""
    before = os.readlink(INSTALLED) if INSTALLED.is_symlink() else None
    if os.path.lexists(INSTALLED) and before is None:
        pytest.skip(f"{INSTALLED} is not a link: these tests would not run this tree's helper")
    if before is not None and _same_file_text(INSTALLED.parent / before, HELPER):
        yield INSTALLED  # (the tests pass CASFS_BIN: the script is all that matters)
        return
    if os.geteuid() != 0:
        pytest.skip(f"mount(8) tests need root, or {INSTALLED} linked to {HELPER}")
    _link(INSTALLED, HELPER)
    try:
        yield INSTALLED
    finally:
        if before is None:
            INSTALLED.unlink()
        else:
            _link(INSTALLED, Path(before))


def _same_file_text(a: Path, b: Path) -> bool:
    try:
        return a.read_bytes() == b.read_bytes()
    except FileNotFoundError:
        return False


def _link(path: Path, target: Path) -> None:
    """Point the link at `target` in one rename, so a concurrent mount(8) never misses it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    tmp.replace(path)


@pytest.fixture
def store(store: Path, tmp_path: Path) -> Path:
    """The store, with a directory image `tree` and a volume `vol` of it."""
    src = tmp_path / "src"
    (src / "etc").mkdir(parents=True)
    (src / "etc" / "hostname").write_text("casfs\n")
    ok(store, "image", "import", "tree", str(src))
    ok(store, "volume", "create", "vol", "--from", "tree")
    return store


def tool(*cmd: str | Path) -> Completed:
    """mount(8) and umount(8), finding the casfs command through the helper's CASFS_BIN."""
    return run(cmd, timeout=TIMEOUT, env=env(CASFS_BIN=str(CASFS_BIN)))


def daemon_pid(store: Path, mountpoint: Path) -> int | None:
    for path in (store / "run").glob("*.json"):
        doc = json.loads(path.read_text())
        if doc.get("mountpoint") == str(mountpoint) and doc.get("state") == "mounted":
            return int(doc["pid"])
    return None


@contextlib.contextmanager
def mounted_by(store: Path, mountpoint: Path, *mount_args: str | Path) -> Iterator[str]:
    """Run mount(8) with `mount_args`; yield the mount's options from /proc/mounts;
    then `umount`, and wait for the daemon to exit. Always leaves nothing mounted."""
    mountpoint.mkdir(exist_ok=True)
    pid = None
    try:
        done = tool("mount", *mount_args)
        assert done.returncode == 0, done.stderr
        pid = daemon_pid(store, mountpoint)
        assert pid is not None and alive(pid)
        (line,) = [ln for ln in Path("/proc/mounts").read_text().splitlines() if f" {mountpoint} " in ln]
        source, point, fstype, options = line.split()[:4]
        assert (source, point, fstype) == (f"casfs:{store}", str(mountpoint), "fuse.casfs")
        yield options
        done = tool("umount", mountpoint)
        assert done.returncode == 0, done.stderr
        assert wait_gone(pid, None, TIMEOUT), "the daemon did not exit after umount"
        assert not is_mounted(mountpoint)
    finally:
        if is_mounted(mountpoint) or (pid is not None and alive(pid)):
            cleanup(mountpoint, pid)


def test_mount_t_fuse_casfs_one_volume_read_only(helper: Path, store: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    with mounted_by(store, mnt, "-t", "fuse.casfs", f"{store}:vol", mnt, "-o", "ro") as options:
        assert options.split(",")[0] == "ro"
        assert sorted(os.listdir(mnt)) == ["etc"]
        assert (mnt / "etc" / "hostname").read_text() == "casfs\n"
        with pytest.raises(OSError):
            (mnt / "new").write_text("x")


def test_fstab_lines_volume_and_whole_store(helper: Path, store: Path, tmp_path: Path) -> None:
    vol, whole = tmp_path / "vol", tmp_path / "all"
    fstab = tmp_path / "fstab"
    fstab.write_text(
        f"{store}:vol {vol} fuse.casfs defaults,ro 0 0\n"
        f"{store} {whole} fuse.casfs defaults,nofail,noauto,x-systemd.automount,_netdev 0 0\n"
    )
    with mounted_by(store, vol, "-T", fstab, vol) as options:
        assert options.split(",")[0] == "ro"
        assert (vol / "etc" / "hostname").read_text() == "casfs\n"
        with mounted_by(store, whole, "-T", fstab, whole):
            assert sorted(os.listdir(whole)) == ["images", "snapshots", "volumes"]
            assert os.listdir(whole / "volumes") == ["vol"]


def test_unknown_options_are_refused(helper: Path, store: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = tool("mount", "-t", "fuse.casfs", f"{store}:vol", mnt, "-o", "ro,compress=zstd")
    assert done.returncode != 0
    assert "unknown option 'compress=zstd'" in done.stderr
    assert not any(m.mountpoint == str(mnt) for m in mounts())


def test_translation() -> None:
    def translate(*args: str) -> str:
        done = tool(HELPER, "-f", "-v", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().removeprefix(f"{CASFS_BIN} ")

    assert (
        translate("/s:vm1", "/m", "-o", "rw,ro,allow_other,nofail")
        == "-s /s mount /m --volume vm1 --ro --allow-other"
    )
    assert translate("casfs:/var/lib/casfs", "/m", "-o", "defaults") == "-s /var/lib/casfs mount /m"
    assert translate("/s", "/m", "-o", "nosuid,nodev") == "-s /s mount /m"  # (a FUSE mount's own)
    assert translate("/s", "/m", "-o", "suid") == "-s /s mount /m --suid"
    assert (
        translate("/odd:dir/store:v", "/m", "-n", "-o", "ro") == "-s /odd:dir/store mount /m --volume v --ro"
    )
    for bad in (["/s:v"], ["/s:v", "/m", "-o", "uid=0"], ["/s:v", "/m", "-q"]):
        done = tool(HELPER, "-f", *bad)
        assert done.returncode == 1 and done.stderr.startswith("mount.fuse.casfs: "), done.stderr
