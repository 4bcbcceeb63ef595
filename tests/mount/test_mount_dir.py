"""Read/write directory volumes through a real mount, against ext4 as the reference.

Most tests do the same thing to a directory on the native filesystem (ext4 under
pytest's tmp_path) and to a mounted volume, and compare what comes back: trees with
tests/helpers/trees.py (lstat, xattrs, content, hardlink groups), command output, errno.

What is deliberately not compared, and why:
- atime after copying IN: `cp -a` stamps the destination with the atime the source had
  before cp read it, while the source's own atime then moves (relatime). Trees copied
  OUT of the mount are compared with atimes (trees.snapshot reads with O_NOATIME). atime
  is relatime for reads of files in the volume's overlay; readdir and readlink leave
  it alone (ext4 moves it): test_cp_a_in_and_out spells out which entries move.
- inode numbers and st_dev: different filesystems.
- a directory's st_size and st_blocks: ext4 reports 4096 and up, casfs 0.

Every store is checked with fsck when its test ends (tests/conftest.py).
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pytest

from casfs import images, volumes
from casfs.repo import Repository
from tests.helpers import trees
from tests.helpers.cli import casfs, run
from tests.helpers.fsck import fsck_clean
from tests.helpers.mount import (
    Mount,
    as_nobody,
    cleanup,
    is_mounted,
    mounted,
    public_dir,
    start_daemon,
    wait_gone,
)

GIB = 1 << 30
EMAIL = next(Path("/usr/lib").glob("python3*/email"), None)


# -- helpers -------------------------------------------------------------------------------


def sh(cmd: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A shell line in `cwd` (the same line is run on ext4 and on the mount)."""
    return subprocess.run(
        ["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def errno_of(fn: Callable[[], object]) -> int:
    """0, or the errno the call failed with."""
    try:
        fn()
    except OSError as e:
        return e.errno or -1
    return 0


_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


def renameat2(old: Path, new: Path, flags: int) -> None:
    """renameat2(2) through libc (Python has no binding)."""
    rc = _libc.renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), ctypes.c_uint(flags))
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(old))


def xattr(path: Path, name: str) -> str:
    done = run(["getfattr", "--only-values", "-n", name, path])
    assert done.returncode == 0, done.stderr
    return done.stdout


def tree_with_everything(top: Path) -> None:
    """Real files (python's email package), plus what cp -a must keep: symlinks,
    hardlinks, xattrs, a sparse 1 GiB file, odd names, a fifo, modes, owners, times."""
    top.mkdir()
    if EMAIL is not None:
        run(["cp", "-a", EMAIL, top / "email"], check=True)
    else:  # pragma: no cover - a system without python's stdlib sources
        (top / "email").mkdir()
        (top / "email" / "x.py").write_text("x = 1\n" * 1000)
    odd = top / "odd"
    odd.mkdir()
    for name in (b"with space", b"new\nline", b"\xff\xfe-not-utf8-\xe9", b"x" * 255, b"-dash", b"tab\there"):
        with open(os.fsencode(odd) + b"/" + name, "wb") as f:
            f.write(name * 3)
    (top / "links").mkdir()
    (top / "links" / "target.txt").write_text("target\n")
    os.link(top / "links" / "target.txt", top / "links" / "hard1")
    os.link(top / "links" / "target.txt", top / "odd" / "hard2")
    os.symlink("target.txt", top / "links" / "rel")
    os.symlink("/etc/hostname", top / "links" / "abs")
    os.symlink("../nowhere", top / "links" / "dangling")
    os.symlink("../email", top / "links" / "to_dir")
    run(["setfattr", "-n", "user.one", "-v", "1", top / "links" / "target.txt"], check=True)
    run(
        ["setfattr", "-n", "user.binary", "-v", "0x" + bytes(range(256)).hex(), top / "links" / "target.txt"],
        check=True,
    )
    run(["setfattr", "-n", "user.dir", top / "odd"], check=True)
    run(["truncate", "-s", "1G", top / "sparse"], check=True)
    with open(top / "sparse", "r+b") as f:  # 10 kB of data in the middle
        f.seek(GIB // 2 + 1000)
        f.write(os.urandom(10_000))
    (top / "empty").touch()
    (top / "empty_dir").mkdir()
    os.mkfifo(top / "fifo")
    (top / "private").write_text("secret\n")
    os.chmod(top / "private", 0o600)
    (top / "suid").write_text("#!/bin/sh\n")
    os.chmod(top / "suid", 0o4755)
    (top / "shared").mkdir()
    os.chmod(top / "shared", 0o2775)
    os.chown(top / "private", 1234, 5678)
    os.utime(top / "empty", ns=(1_000_000_001, 2_000_000_002))


def diff(a: trees.Snapshot, b: trees.Snapshot, ignore: Collection[str] = ()) -> list[str]:
    """trees.compare for two snapshots already taken (each takes a full read)."""
    out = [f"only in the first: {p!r}" for p in sorted(a.keys() - b.keys())]
    out += [f"only in the second: {p!r}" for p in sorted(b.keys() - a.keys())]
    for p in sorted(a.keys() & b.keys()):
        for k in sorted((a[p].keys() | b[p].keys()) - set(ignore)):
            if a[p].get(k) != b[p].get(k):
                out.append(f"{p!r} {k}: {a[p].get(k)!r} != {b[p].get(k)!r}")
    return out


def atimes(top: Path) -> dict[bytes, object]:
    """Every entry's atime, keyed as trees.snapshot keys them (lstat only: reads nothing)."""
    root = os.fsencode(top)
    out: dict[bytes, object] = {b"": os.lstat(root).st_atime_ns}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(here, name)
            out[os.path.relpath(path, root)] = os.lstat(path).st_atime_ns
    return out


def du_bytes(path: Path) -> int:
    return int(run(["du", "-s", "-B1", path], check=True).stdout.split()[0])


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def blank(repo: Repository) -> Repository:
    """A store with one blank read/write directory volume `v`."""
    volumes.create_volume(repo, "v", volumes.Source(blank_dir=True))
    return repo


@pytest.fixture
def vol(blank: Repository, tmp_path: Path) -> Iterator[Mount]:
    """Volume `v` mounted on its own (`--volume v`)."""
    with mounted(blank.path, tmp_path / "mnt", volume="v") as m:
        yield m


@pytest.fixture(params=[False, True], ids=["uncached", "kernel-cached"])
def any_vol(blank: Repository, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Mount]:
    """Volume `v` mounted as `vol`, and as a user mounts it: the kernel keeps entries and
    attributes of a read/write volume as long as an image's (Operations._timeout), so
    what it caches must stay true through every change."""
    with mounted(blank.path, tmp_path / "mnt", volume="v", kernel_cache=request.param) as m:
        yield m


@pytest.fixture
def native(tmp_path: Path) -> Path:
    """The reference: a directory on the native filesystem (ext4)."""
    path = tmp_path / "native"
    path.mkdir()
    return path


# -- cp -a in and out --------------------------------------------------------------------------


def test_cp_a_in_and_out(blank: Repository, tmp_path: Path) -> None:
    src, ref, out = tmp_path / "src", tmp_path / "ref", tmp_path / "out"
    tree_with_everything(src)
    run(["cp", "-a", src, ref], check=True, timeout=120)
    # (each snapshot reads the 1 GiB sparse file through the mount: a few seconds)
    with mounted(blank.path, tmp_path / "mnt", volume="v") as m:
        done = run(["cp", "-a", src, m.path / "tree"], timeout=120)
        assert done.returncode == 0, done.stderr
        written = trees.snapshot(m.path / "tree")
        assert diff(trees.snapshot(ref), written, ignore=("atime",)) == []
        # sparse stays sparse: 10 kB of data in 1 GiB
        assert os.stat(m.path / "tree" / "sparse").st_size == GIB
        assert du_bytes(m.path / "tree" / "sparse") < 1 << 20
        run(["cp", "-a", m.path / "tree", out], check=True, timeout=120)
        # out of the mount, atimes included: reading through the mount changed none
        assert diff(written, trees.snapshot(out)) == []
        assert du_bytes(out / "sparse") < 1 << 20
        # relatime, as on ext4: cp read every file, whose atime was older than its ctime
        # (cp -a in stamped the times last). Not moved here, unlike ext4: directories
        # on readdir and symlinks on readlink (casfs keeps relatime for file reads), and
        # empty files (the kernel answers a read at EOF itself) unless passthrough serves
        # them (its open is the access, as ext4 counts the read at EOF). trees.snapshot
        # reads with O_NOATIME, which the mount honours.
        now = atimes(m.path / "tree")
        kernel = os.getxattr(m.path, "user.casfs.passthrough") == b"on"
        read = {p for p, e in written.items() if e["type"] == stat.S_IFREG and (e["size"] or kernel)}
        assert {p for p in now if now[p] != written[p]["atime"]} == read
        written = {p: dict(e, atime=now[p]) for p, e in written.items()}
    # what was written is what the snapshot taken at unmount holds (not compared with
    # `out` again: ext4 moves a symlink's atime when it is read, as trees.snapshot does)
    with mounted(blank.path, tmp_path / "mnt", volume="v") as m:
        assert diff(written, trees.snapshot(m.path / "tree")) == []
        assert du_bytes(m.path / "tree" / "sparse") < 1 << 20
    with mounted(blank.path, tmp_path / "whole") as m:
        for sub in (b"email", b"links", b"odd"):
            want = {b"": written[sub]}
            want |= {k.removeprefix(sub + b"/"): v for k, v in written.items() if k.startswith(sub + b"/")}
            got = trees.snapshot(m.path / "volumes" / "v" / "tree" / os.fsdecode(sub))
            assert diff(want, got, ignore=("hardlink_group",)) == []


# -- everyday tools, side by side with ext4 ---------------------------------------------------

TOOLS_SCRIPT = r"""
set -e
mkdir -p a/b c 'with space'
printf hello > a/f
printf world > a/b/g
head -c 300000 /dev/zero | tr '\0' x > 'with space/big'
ln a/f a/f_hard
ln -s ../a/f c/sym
ln -s nowhere c/dangling
ln -sf g c/sym2
mv a/b/g c/                 # across directories
printf victim > c/victim
mv a/f_hard c/victim        # over an existing file
mv a/b c/b2                 # a directory, to another parent
mkdir c/b2/inner && mv c/b2 a/b
setfattr -n user.x -v 1 a/f
setfattr -n user.y -v 0x00ff a/f
setfattr -n user.gone -v 1 a/f
setfattr -x user.gone a/f
setfattr -n user.on_dir -v d a/b
echo '== getfattr'; getfattr -d -m - -e hex a/f a/b c/g | sort
echo '== getfattr one'; getfattr --only-values -n user.x a/f; echo
echo '== missing'; getfattr -n user.nope a/f 2>&1 || echo "status $?"
echo '== ls'; ls -lAR --time-style=+ .
echo '== find'; find . -printf '%y %m %n %u %g %s %p -> %l\n' | sort
echo '== du'; du -ab --apparent-size --count-links . | sort -k2
echo '== readlink'; readlink c/sym c/dangling; cat c/sym c/sym2
echo '== stat'; stat -c '%n %h %s %F %a' a/f c/victim a a/b c
"""


def normalize(text: str) -> list[str]:
    """Drop what differs between ext4 and casfs by design: a directory's size (4096 on
    ext4, 0 here) in ls, find, du and stat output, ls's block totals and column widths."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["total"]:
            continue
        if len(words) >= 6 and words[0].startswith("d") and len(words[0]) == 10:
            words[4] = "DIRSIZE"  # ls -l: mode links user group SIZE name
        elif words[:1] == ["d"]:
            words[5] = "DIRSIZE"  # find -printf '%y %m %n %u %g %s ...'
        elif "\t" in line and line.split("\t")[0].isdigit():  # du -ab
            size, path = line.split("\t", 1)
            words = [
                "SIZE" if os.path.basename(path) in ("", ".", "a", "b", "inner", "c", "with space") else size,
                path,
            ]
        elif "directory" in words:  # stat -c '%n %h %s %F %a'
            words[2] = "DIRSIZE"
        out.append(" ".join(words))
    return out


def test_tools_behave_as_on_ext4(any_vol: Mount, native: Path, tmp_path: Path) -> None:
    here = sh(TOOLS_SCRIPT, native)
    assert here.returncode == 0, here.stderr
    there = sh(TOOLS_SCRIPT, any_vol.path)
    assert there.returncode == 0, there.stderr
    assert normalize(there.stdout) == normalize(here.stdout)
    # (created at different moments: mtimes differ; everything else must not)
    assert trees.compare(native, any_vol.path, ignore=("atime", "mtime")) == []
    # tar: one archive (ns times, xattrs) extracted on both; then one made from the mount
    archive, again = tmp_path / "t.tar", tmp_path / "again.tar"
    tar = ["tar", "--format=posix", "--xattrs", "--xattrs-include=*"]
    run([*tar, "-cf", archive, "-C", native, "."], check=True)
    for top in (native, any_vol.path):
        (top / "x").mkdir()
        done = run([*tar, "-xf", archive, "-C", top / "x"])
        assert done.returncode == 0, done.stderr
    assert trees.compare(native / "x", any_vol.path / "x", ignore=("atime",)) == []
    run([*tar, "-cf", again, "-C", any_vol.path / "x", "."], check=True)
    (tmp_path / "y").mkdir()
    run([*tar, "-xf", again, "-C", tmp_path / "y"], check=True)
    assert trees.compare(native / "x", tmp_path / "y", ignore=("atime",)) == []
    listing = [run(["tar", "-tvf", a], check=True).stdout for a in (archive, again)]
    assert listing[0].splitlines()[1:] == listing[1].splitlines()[1:]  # (the first is "./")


# -- link counts and ctime ------------------------------------------------------------------


def link_unlink_rename(top: Path) -> list[str]:
    """Link counts and ctimes right after each change; checked the same on both."""
    problems: list[str] = []

    def check(what: str, cond: bool) -> None:
        if not cond:
            problems.append(what)

    (top / "d1").mkdir()
    (top / "d2").mkdir()
    f = top / "d1" / "f"
    f.write_text("x")
    before = os.stat(f)
    d2_before = os.stat(top / "d2")
    time.sleep(0.01)
    os.link(f, top / "d2" / "f2")
    st = os.stat(f)
    check("link: nlink 2", st.st_nlink == 2 and os.stat(top / "d2" / "f2").st_nlink == 2)
    check("link: ctime moves", st.st_ctime_ns > before.st_ctime_ns)
    check("link: mtime stays", st.st_mtime_ns == before.st_mtime_ns)
    d2 = os.stat(top / "d2")
    check("link: the new parent's mtime and ctime move", d2.st_mtime_ns > d2_before.st_mtime_ns)
    check("link: parent ctime", d2.st_ctime_ns > d2_before.st_ctime_ns)
    time.sleep(0.01)
    os.unlink(f)
    st2 = os.stat(top / "d2" / "f2")
    check("unlink: nlink 1", st2.st_nlink == 1)
    check("unlink: ctime moves", st2.st_ctime_ns > st.st_ctime_ns)
    time.sleep(0.01)
    os.rename(top / "d2" / "f2", top / "d1" / "back")
    st3 = os.stat(top / "d1" / "back")
    check("rename: ctime moves", st3.st_ctime_ns > st2.st_ctime_ns)
    check("rename: same inode", st3.st_ino == st2.st_ino)
    # directories: 2 + subdirectories
    root0 = os.stat(top).st_nlink
    (top / "d1" / "sub").mkdir()
    check("mkdir: parent nlink 3", os.stat(top / "d1").st_nlink == 3)
    os.rename(top / "d1" / "sub", top / "d2" / "sub")
    check("rename dir: old parent nlink 2", os.stat(top / "d1").st_nlink == 2)
    check("rename dir: new parent nlink 3", os.stat(top / "d2").st_nlink == 3)
    os.rmdir(top / "d2" / "sub")
    check("rmdir: nlink 2", os.stat(top / "d2").st_nlink == 2)
    check("root nlink unchanged", os.stat(top).st_nlink == root0)
    # an open file's fstat after unlink: nlink 0
    with open(top / "d1" / "back", "rb") as fh:
        os.unlink(top / "d1" / "back")
        check("fstat after unlink: nlink 0", os.fstat(fh.fileno()).st_nlink == 0)
    return problems


def test_link_counts_and_ctime(any_vol: Mount, native: Path) -> None:
    assert link_unlink_rename(native) == []
    assert link_unlink_rename(any_vol.path) == []


def test_a_missing_name_appears_when_made_and_goes_when_removed(any_vol: Mount) -> None:
    """The kernel may remember a missing name (a negative entry, kernel-cached mounts):
    whatever this mount then makes under that name must show at once, and go again."""
    top = any_vol.path
    (top / "d").mkdir()
    name = top / "d" / "n"
    steps: list[tuple[Callable[[], object], Callable[[], object]]] = [
        (lambda: name.write_text("file"), name.unlink),
        (name.mkdir, name.rmdir),
        (lambda: os.symlink("target", name), name.unlink),
        (lambda: os.link(top / "d" / "other", name), name.unlink),
        (lambda: os.rename(top / "d" / "other", name), lambda: os.rename(name, top / "d" / "other")),
    ]
    for make, remove in steps:
        (top / "d" / "other").write_text("other")
        for _ in range(2):
            assert errno_of(lambda: os.lstat(name)) == errno.ENOENT
        make()
        assert os.lstat(name) is not None and "n" in os.listdir(top / "d")
        remove()
        assert errno_of(lambda: os.lstat(name)) == errno.ENOENT
        assert "n" not in os.listdir(top / "d")


# -- open files ----------------------------------------------------------------------------


def test_unlink_and_rename_open_files(vol: Mount) -> None:
    top = vol.path
    data = os.urandom(200_000)
    path = top / "doomed"
    with open(path, "w+b") as f:
        f.write(data)
        f.flush()
        os.unlink(path)
        assert not path.exists()
        f.write(b"more after unlink")
        f.flush()
        os.fsync(f.fileno())
        f.seek(0)
        assert f.read() == data + b"more after unlink"
        f.truncate(1000)
        f.seek(0)
        assert f.read() == data[:1000]
    # closed: nothing left, and not an error
    assert os.listdir(top) == []
    # rename while open, from both sides; the handle follows the inode
    (top / "a").mkdir()
    with open(top / "a" / "f", "w+b") as f:
        f.write(b"one")
        f.flush()
        os.rename(top / "a" / "f", top / "g")
        f.write(b"two")
        f.flush()
        assert (top / "g").read_bytes() == b"onetwo"
        # replaced by another file while open: the old inode stays readable
        (top / "h").write_bytes(b"replacement")
        os.rename(top / "h", top / "g")
        f.seek(0)
        assert f.read() == b"onetwo"
        f.write(b"three")
    assert (top / "g").read_bytes() == b"replacement"
    # an unlinked directory that is still someone's cwd
    (top / "gone").mkdir()
    fd = os.open(top / "gone", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rmdir(top / "gone")
        assert os.listdir(fd) == []
        with pytest.raises(FileNotFoundError):
            os.open("new", os.O_CREAT | os.O_WRONLY, dir_fd=fd)
    finally:
        os.close(fd)
    # many open-unlinked files survive a snapshot taken while they are open
    handles = []
    for i in range(5):
        f = open(top / f"tmp{i}", "w+b")  # noqa: SIM115 - closed below
        f.write(bytes([i]) * 100_000)
        f.flush()
        os.unlink(top / f"tmp{i}")
        handles.append(f)
    try:
        assert run(["setfattr", "-n", "user.casfs.snapshot", top]).returncode == 0
        for i, f in enumerate(handles):
            f.seek(0)
            assert f.read() == bytes([i]) * 100_000
    finally:
        for f in handles:
            f.close()
    assert sorted(os.listdir(top)) == ["a", "g"]


# -- modes, owners and times -------------------------------------------------------------------


def test_missing_labels_and_acls_are_unsupported_so_ls_stops_asking(vol: Mount) -> None:
    """`ls -l` asks every entry for its SELinux label and ACL, and stops for the whole
    file system after one "not supported" (coreutils caches it per st_dev): a missing one
    answers that, where ENODATA cost two requests per entry. A label that is there is
    answered, as is any other missing name's ENODATA."""
    top = vol.path
    (top / "d").mkdir()
    for name in ("plain", "labelled"):
        (top / "d" / name).write_text(name)
    label = top / "d" / "labelled"
    assert (
        run(["setfattr", "-n", "security.selinux", "-v", "system_u:object_r:etc_t:s0", label]).returncode == 0
    )
    for path in (top / "d" / "plain", top / "d"):
        for name in ("security.selinux", "system.posix_acl_access"):
            done = run(["getfattr", "-n", name, path])
            assert done.returncode == 1 and "Operation not supported" in done.stderr, (
                path,
                name,
                done.stderr,
            )
    assert xattr(label, "security.selinux") == "system_u:object_r:etc_t:s0"
    done = run(["getfattr", "-n", "user.nope", top / "d" / "plain"])
    assert done.returncode == 1 and "No such attribute" in done.stderr, done.stderr
    listing = run(["ls", "-l", top / "d"])
    assert listing.returncode == 0 and "labelled" in listing.stdout and "plain" in listing.stdout, (
        listing.stderr
    )


def umask_and_setgid(top: Path) -> dict[str, tuple[int, int]]:
    """(mode, gid) of what root creates under a umask and in a setgid directory."""
    old = os.umask(0o027)
    try:
        fd = os.open(top / "created", os.O_CREAT | os.O_WRONLY, 0o666)
        os.close(fd)
        os.mkdir(top / "made", 0o777)
        os.mknod(top / "fifo", stat.S_IFIFO | 0o666)
        os.mkdir(top / "sgid")
        os.chown(top / "sgid", 0, 4321)
        os.chmod(top / "sgid", 0o2775)
        (top / "sgid" / "file").touch()
        os.mkdir(top / "sgid" / "dir")
        os.mkdir(top / "sgid" / "dir" / "deeper")
    finally:
        os.umask(old)
    out = {}
    for rel in ("created", "made", "fifo", "sgid", "sgid/file", "sgid/dir", "sgid/dir/deeper"):
        st = os.lstat(top / rel)
        out[rel] = (stat.S_IMODE(st.st_mode), st.st_gid)
    return out


def test_umask_and_setgid_inheritance(any_vol: Mount, native: Path) -> None:
    want = umask_and_setgid(native)
    assert want["created"] == (0o640, 0) and want["sgid/dir/deeper"] == (0o2750, 4321)
    assert umask_and_setgid(any_vol.path) == want


def privileges(top: Path) -> dict[str, object]:
    """Set-id bits after writes and chowns, as root and as nobody."""
    out: dict[str, object] = {}
    for name in ("w_suid", "w_sgid", "w_sgid_noexec", "chown_suid", "chown_sgid", "chmod_by_nobody"):
        (top / name).write_bytes(b"#!/bin/sh\n")
    os.chmod(top / "w_suid", 0o4777)
    os.chmod(top / "w_sgid", 0o2777)
    os.chmod(top / "w_sgid_noexec", 0o2666)  # mandatory-locking style: no group exec, kept
    for name in ("w_suid", "w_sgid", "w_sgid_noexec"):
        done = as_nobody("sh", "-c", f"echo more >> '{top / name}'")
        out[name + " write"] = done.returncode
    os.chmod(top / "chown_suid", 0o4755)
    os.chmod(top / "chown_sgid", 0o2755)
    os.chown(top / "chown_suid", 1000, 1000)
    os.chown(top / "chown_sgid", 1000, 1000)
    # nobody owns it, sets setgid for a group it is not in: the kernel drops the bit
    os.chown(top / "chmod_by_nobody", 65534, 0)
    out["chmod_by_nobody status"] = as_nobody("chmod", "2755", top / "chmod_by_nobody").returncode
    # nobody may not chown
    out["chown_by_nobody status"] = as_nobody("chown", "65534:65534", top / "w_suid").returncode
    for name in ("w_suid", "w_sgid", "w_sgid_noexec", "chown_suid", "chown_sgid", "chmod_by_nobody"):
        st = os.stat(top / name)
        out[name] = (oct(stat.S_IMODE(st.st_mode)), st.st_uid, st.st_gid)
    out["content"] = (top / "w_suid").read_bytes()
    return out


def test_setuid_cleared_by_write_and_chown(blank: Repository) -> None:
    with public_dir() as pub, mounted(blank.path, pub / "mnt", volume="v", extra=["--allow-other"]) as m:
        (pub / "native").mkdir()
        want = privileges(pub / "native")
        assert want["w_suid"] == ("0o777", 0, 0) and want["content"] == b"#!/bin/sh\nmore\n"
        os.chmod(m.path, 0o755)
        # One known difference, on the kernel's side: for a setgid file WITHOUT group
        # exec, ext4 (Linux >= 6.2, setattr_should_drop_sgid) also drops setgid when the
        # writer is not in the file's group; FUSE's fuse_setattr keeps the old rule
        # (drop only with group exec). With passthrough casfs clears under
        # handle_killpriv_v2 and keeps that rule too (casfs.fuse.killpriv): the kernel's
        # request does not say who wrote, and the write's kill flag is not passed on.
        assert want["w_sgid_noexec"] == ("0o666", 0, 0)
        assert privileges(m.path) == want | {"w_sgid_noexec": ("0o2666", 0, 0)}


def times(top: Path) -> dict[str, object]:
    f = top / "f"
    f.write_text("x")
    os.utime(f, ns=(1_111_111_111_123_456_789, 1_222_222_222_987_654_321))
    out: dict[str, object] = {"utime ns": (os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns)}
    run(["touch", "-m", "-d", "@1500000000.5", f], check=True)  # UTIME_OMIT for atime
    out["touch -m"] = (os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns)
    run(["touch", "-a", "-d", "@1400000000.25", f], check=True)  # UTIME_OMIT for mtime
    out["touch -a"] = (os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns)
    before = time.time_ns()
    ctime0 = os.stat(f).st_ctime_ns
    run(["touch", f], check=True)  # UTIME_NOW for both
    st = os.stat(f)
    out["touch now"] = st.st_atime_ns >= before - 10_000_000 and st.st_mtime_ns == st.st_atime_ns
    out["ctime moved"] = st.st_ctime_ns >= ctime0
    os.utime(f, ns=(0, -1_000_000_000))  # before the epoch
    out["negative"] = (os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns)
    # a directory and a symlink (lutimes)
    (top / "d").mkdir()
    os.utime(top / "d", ns=(5, 6))
    os.symlink("f", top / "s")
    os.utime(top / "s", ns=(7, 8), follow_symlinks=False)
    out["dir"] = (os.stat(top / "d").st_atime_ns, os.stat(top / "d").st_mtime_ns)
    out["symlink"] = (os.lstat(top / "s").st_atime_ns, os.lstat(top / "s").st_mtime_ns)
    # a write moves mtime and ctime, not atime
    os.utime(f, ns=(10**18, 10**18))
    with open(f, "ab") as fh:
        fh.write(b"y")
    st = os.stat(f)
    out["write"] = (st.st_atime_ns == 10**18, st.st_mtime_ns > 10**18, st.st_ctime_ns > 10**18)
    return out


def test_utimens(any_vol: Mount, native: Path) -> None:
    want = times(native)
    assert want["touch -m"] == (1_111_111_111_123_456_789, 1_500_000_000_500_000_000)
    assert times(any_vol.path) == want


# -- POSIX errors ----------------------------------------------------------------------------

LONG = "n" * 256  # one byte over NAME_MAX


def _open_close(path: Path, flags: int, mode: int = 0o644) -> None:
    os.close(os.open(path, flags, mode))


def _read_one(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1)
    finally:
        os.close(fd)


def error_cases(t: Path) -> list[tuple[str, Callable[[], object]]]:
    """Operations run in order on a fresh tree (see populate); each one's errno is
    compared between ext4 and the mount, and so is the tree they leave."""
    return [
        ("stat missing", lambda: os.stat(t / "missing")),
        ("open missing", lambda: _open_close(t / "missing", os.O_RDONLY)),
        ("unlink missing", lambda: os.unlink(t / "missing")),
        ("rename missing", lambda: os.rename(t / "missing", t / "x")),
        ("create in missing dir", lambda: _open_close(t / "missing" / "f", os.O_CREAT | os.O_WRONLY)),
        ("mkdir existing", lambda: os.mkdir(t / "dir")),
        ("mkdir over file", lambda: os.mkdir(t / "file")),
        ("O_EXCL existing", lambda: _open_close(t / "file", os.O_CREAT | os.O_EXCL | os.O_WRONLY)),
        ("symlink existing", lambda: os.symlink("x", t / "file")),
        ("link existing", lambda: os.link(t / "file", t / "other")),
        ("mknod existing", lambda: os.mkfifo(t / "file")),
        ("rmdir non-empty", lambda: os.rmdir(t / "full")),
        ("rmdir a file", lambda: os.rmdir(t / "file")),
        ("unlink a dir", lambda: os.unlink(t / "dir")),
        ("file as dir", lambda: os.stat(t / "file" / "x")),
        ("create under a file", lambda: _open_close(t / "file" / "x", os.O_CREAT | os.O_WRONLY)),
        ("O_DIRECTORY on a file", lambda: _open_close(t / "file", os.O_RDONLY | os.O_DIRECTORY)),
        ("open a dir for writing", lambda: _open_close(t / "dir", os.O_WRONLY)),
        ("truncate a dir", lambda: os.truncate(t / "dir", 0)),
        ("read a dir", lambda: _read_one(t / "dir")),
        ("readlink a file", lambda: os.readlink(t / "file")),
        ("create long name", lambda: _open_close(t / LONG, os.O_CREAT | os.O_WRONLY)),
        ("stat long name", lambda: os.stat(t / LONG)),
        ("mkdir long name", lambda: os.mkdir(t / LONG)),
        ("symlink long name", lambda: os.symlink("x", t / LONG)),
        ("link long name", lambda: os.link(t / "file", t / LONG)),
        ("rename to long name", lambda: os.rename(t / "file", t / LONG)),
        ("mknod long name", lambda: os.mkfifo(t / LONG)),
        ("create 255-byte name", lambda: _open_close(t / LONG[:255], os.O_CREAT | os.O_WRONLY)),
        ("rename dir over file", lambda: os.rename(t / "dir", t / "file")),
        ("rename file over dir", lambda: os.rename(t / "file", t / "dir")),
        ("rename dir over non-empty dir", lambda: os.rename(t / "dir", t / "full")),
        ("rename dir into itself", lambda: os.rename(t / "full", t / "full" / "sub" / "x")),
        ("rename dir over empty dir", lambda: os.rename(t / "dir", t / "empty")),
        ("rename onto itself", lambda: os.rename(t / "file", t / "file")),
        ("rename onto its hardlink", lambda: os.rename(t / "file", t / "hard")),
        ("link a dir", lambda: os.link(t / "empty", t / "dirlink")),
        ("rmdir .", lambda: os.rmdir(t / "full" / ".")),
        ("noreplace onto existing", lambda: renameat2(t / "file", t / "other", RENAME_NOREPLACE)),
        ("noreplace to new", lambda: renameat2(t / "other", t / "other2", RENAME_NOREPLACE)),
        ("exchange two files", lambda: renameat2(t / "file", t / "other2", RENAME_EXCHANGE)),
        ("exchange with missing", lambda: renameat2(t / "file", t / "missing", RENAME_EXCHANGE)),
        ("exchange file and dir", lambda: renameat2(t / "file", t / "full", RENAME_EXCHANGE)),
        ("exchange across dirs", lambda: renameat2(t / "file", t / "empty" / "..", RENAME_EXCHANGE)),
        ("exchange into own child", lambda: renameat2(t / "file", t / "file" / "sub", RENAME_EXCHANGE)),
        ("both flags", lambda: renameat2(t / "other2", t / "hard", RENAME_EXCHANGE | RENAME_NOREPLACE)),
        ("xattr create existing", lambda: os.setxattr(t / "hard", "user.a", b"2", os.XATTR_CREATE)),
        ("xattr replace missing", lambda: os.setxattr(t / "hard", "user.b", b"2", os.XATTR_REPLACE)),
        ("xattr get missing", lambda: os.getxattr(t / "hard", "user.b")),
        ("xattr remove missing", lambda: os.removexattr(t / "hard", "user.b")),
        ("xattr on symlink (user.*)", lambda: os.setxattr(t / "sym", "user.a", b"1", follow_symlinks=False)),
        ("xattr replace", lambda: os.setxattr(t / "hard", "user.a", b"3", os.XATTR_REPLACE)),
        ("xattr empty value", lambda: os.setxattr(t / "hard", "user.empty", b"")),
        ("xattr bad namespace", lambda: os.setxattr(t / "hard", "bogus.a", b"1")),
        ("xattr small buffer", lambda: os.getxattr(t / "hard", "user.big")),
        ("xattr trusted", lambda: os.setxattr(t / "hard", "trusted.t", b"1")),
        ("symlink to long target", lambda: os.symlink("t" * 4096, t / "longtarget")),
        ("symlink to 4095-byte target", lambda: os.symlink("t" * 4095, t / "okt")),
        ("rmdir missing", lambda: os.rmdir(t / "missing")),
        ("chdir-free getcwd", lambda: os.listdir(t / "file")),
    ]


def populate(t: Path) -> None:
    (t / "dir").mkdir()
    (t / "empty").mkdir()
    (t / "full" / "sub").mkdir(parents=True)
    (t / "file").write_text("file")
    (t / "other").write_text("other")
    os.link(t / "file", t / "hard")
    os.symlink("file", t / "sym")
    os.setxattr(t / "file", "user.a", b"1")
    os.setxattr(t / "file", "user.big", b"x" * 3000)


def errnos(top: Path) -> list[tuple[str, str]]:
    populate(top)
    return [(what, errno.errorcode.get(errno_of(fn), "OK")) for what, fn in error_cases(top)]


def test_posix_errors_as_on_ext4(vol: Mount, native: Path) -> None:
    want = errnos(native)
    assert ("create long name", "ENAMETOOLONG") in want and ("rmdir non-empty", "ENOTEMPTY") in want
    got = errnos(vol.path)
    assert [(w, g) for w, g in zip(want, got, strict=True) if w != g] == []
    assert trees.compare(native, vol.path, ignore=("atime", "mtime")) == []


def test_exdev_between_volumes_of_a_whole_store_mount(blank: Repository, tmp_path: Path) -> None:
    volumes.create_volume(blank, "w", volumes.Source(blank_dir=True))
    with mounted(blank.path, tmp_path / "mnt") as m:
        v, w = m.path / "volumes" / "v", m.path / "volumes" / "w"
        (v / "f").write_text("from v")
        (v / "d").mkdir()
        assert errno_of(lambda: os.rename(v / "f", w / "f")) == errno.EXDEV
        assert errno_of(lambda: os.rename(v / "d", w / "d")) == errno.EXDEV
        assert errno_of(lambda: os.link(v / "f", w / "f")) == errno.EXDEV
        assert errno_of(lambda: renameat2(v / "f", w / "f", RENAME_NOREPLACE)) == errno.EXDEV
        # and mv copies across instead
        run(["mv", v / "f", v / "d", w], check=True)
        assert (w / "f").read_text() == "from v" and (w / "d").is_dir()
        assert os.listdir(v) == []
        # the store's own directories refuse changes
        assert errno_of(lambda: os.mkdir(m.path / "volumes" / "x")) == errno.EROFS
        assert errno_of(lambda: os.rename(w / "f", m.path / "f")) in (errno.EROFS, errno.EXDEV)


# -- special files and O_DIRECT ---------------------------------------------------------------


def test_o_direct_fifo_and_device_nodes(vol: Mount, native: Path) -> None:
    top = vol.path
    data = os.urandom(3 * 65536 + 4096)
    fd = os.open(top / "direct", os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
    try:
        import mmap

        buf = mmap.mmap(-1, len(data))
        buf[:] = data
        assert os.pwritev(fd, [buf], 0) == len(data)
        out = mmap.mmap(-1, 8192)
        assert os.preadv(fd, [out], 65536 - 4096) == 8192
        assert out[:] == data[65536 - 4096 : 65536 + 4096]
        os.fsync(fd)
    finally:
        os.close(fd)
    assert (top / "direct").read_bytes() == data
    # a fifo works through the mount
    os.mkfifo(top / "fifo", 0o600)
    assert stat.S_ISFIFO(os.lstat(top / "fifo").st_mode)
    reader = subprocess.Popen(["cat", top / "fifo"], stdout=subprocess.PIPE)
    try:
        with open(top / "fifo", "wb") as w:
            w.write(b"through the fifo")
        assert reader.communicate(timeout=10)[0] == b"through the fifo"
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait(timeout=10)
    # device nodes (root only); the mount is nodev, so they are not opened
    for top_ in (native, top):
        os.mknod(top_ / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.mknod(top_ / "blk", stat.S_IFBLK | 0o600, os.makedev(7, 0))
        os.mknod(top_ / "sock", stat.S_IFSOCK | 0o600)
        os.mknod(top_ / "reg", 0o600)  # S_IFMT 0: a regular file
    for name in ("null", "blk", "sock", "reg"):
        a, b = os.lstat(native / name), os.lstat(top / name)
        assert (a.st_mode, a.st_rdev, a.st_size) == (b.st_mode, b.st_rdev, b.st_size), name


# -- readdir while the directory changes ----------------------------------------------------------


_SYS_GETDENTS64 = {"x86_64": 217, "aarch64": 61}.get(os.uname().machine)


def getdents(fd: int, size: int = 512) -> list[str]:
    """One getdents64(2) call with a small buffer: a few entries per call, so the
    directory is read from many offsets (os.scandir reads 32 KiB at a time)."""
    assert _SYS_GETDENTS64 is not None
    buf = ctypes.create_string_buffer(size)
    n = _libc.syscall(_SYS_GETDENTS64, fd, buf, size)
    if n < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    raw, names, pos = buf.raw[:n], [], 0
    while pos < n:
        reclen = int.from_bytes(raw[pos + 16 : pos + 18], "little")
        name = raw[pos + 19 : pos + reclen].split(b"\0", 1)[0].decode()
        if name not in (".", ".."):
            names.append(name)
        pos += reclen
    return names


def scan_while_changing(top: Path, rnd: random.Random, present: list[str]) -> list[str]:
    """Read the directory a few entries at a time; between reads, delete some of
    `present` and create new names. The names seen, in order."""
    seen: list[str] = []
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while names := getdents(fd):
            seen += names
            if present:  # (while there is churn: a reader at the end would chase new names)
                for _ in range(min(3, len(present))):
                    os.unlink(top / present.pop(rnd.randrange(len(present))))
                (top / f"new{len(seen):05d}-{rnd.randrange(10**6)}").touch()
    finally:
        os.close(fd)
    return seen


@pytest.mark.skipif(_SYS_GETDENTS64 is None, reason="getdents64 syscall number unknown here")
def test_readdir_offsets_are_stable_while_the_directory_changes(vol: Mount, native: Path) -> None:
    rnd = random.Random(2024)
    for label, top in (("ext4", native), ("base", vol.path / "a"), ("overlay", vol.path / "b")):
        top.mkdir(exist_ok=True)
        stable = {f"keep{i:04d}" for i in range(1000)}
        churn = [f"churn{i:04d}" for i in range(1000)]
        for name in sorted(stable) + churn:
            (top / name).touch()
        if label == "base":
            # folded into the volume's base by a snapshot: read from the tree, then
            # materialized (copied up) by the first unlink in the middle of the read
            assert run(["setfattr", "-n", "user.casfs.snapshot", vol.path]).returncode == 0
        seen = scan_while_changing(top, rnd, churn)
        dupes = sorted({n for n in seen if seen.count(n) > 1})
        assert dupes == [], (label, dupes[:10])
        assert sorted(stable - set(seen)) == [], label
        assert set(seen) <= stable | {n for n in seen if n.startswith(("churn", "new"))}


# -- copy-on-write and snapshots -----------------------------------------------------------------


def small_tree(top: Path) -> dict[str, bytes]:
    files = {
        "a.txt": b"alpha\n",
        "big.bin": os.urandom(5 * 65536 + 333),
        "sub/b.txt": b"beta\n",
        "sub/deeper/c.bin": os.urandom(70_000),
    }
    for rel, data in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_bytes(data)
    os.setxattr(top / "a.txt", "user.kept", b"yes")
    return files


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_clones_of_one_image_diverge_and_the_image_never_changes(repo: Repository, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    files = small_tree(src)
    images.import_image(repo, "img", src)
    for name in ("a", "b"):
        volumes.create_volume(repo, name, volumes.Source(image="img"))
    with mounted(repo.path, tmp_path / "mnt") as m:
        a, b, img = (m.path / "volumes" / "a", m.path / "volumes" / "b", m.path / "images" / "img")
        assert trees.compare(src, a, ignore=("atime",)) == []
        noise = os.urandom(70_000)
        patch(a / "big.bin", 65536 + 100, noise)  # across a chunk boundary
        (a / "sub" / "b.txt").unlink()
        (a / "new_in_a").write_bytes(b"only a")
        patch(b / "big.bin", 10, b"B")
        os.rename(b / "sub", b / "moved")
        os.setxattr(b / "a.txt", "user.kept", b"changed in b")
        for v in (a, b):
            os.sync()  # (fsync of a file flushes its whole volume; sync reaches both)
            assert run(["setfattr", "-n", "user.casfs.snapshot", v]).returncode == 0
        big = bytearray(files["big.bin"])
        big[65536 + 100 : 65536 + 100 + 70_000] = noise
        assert (a / "big.bin").read_bytes() == big
        assert sorted(os.listdir(a)) == ["a.txt", "big.bin", "new_in_a", "sub"]
        assert os.listdir(a / "sub") == ["deeper"]
        big = bytearray(files["big.bin"])
        big[10] = ord("B")
        assert (b / "big.bin").read_bytes() == big
        assert sorted(os.listdir(b)) == ["a.txt", "big.bin", "moved"]
        assert os.getxattr(a / "a.txt", "user.kept") == b"yes"
        # the image, read through the same mount, is what was imported
        assert trees.compare(src, img, ignore=("atime",)) == []
        # each clone has bytes of its own now (stored bytes: 2 new chunks in a, 1 in b)
        ua, ub = int(xattr(a, "user.casfs.unique")), int(xattr(b, "user.casfs.unique"))
        assert ua >= 2 * 65536 and 0 < ub < ua
    # and out of the store, byte for byte
    done = casfs(repo.path, "image", "export", "img", tmp_path / "exported")
    assert done.returncode == 0, done.stderr
    assert trees.compare(src, tmp_path / "exported", ignore=("atime",)) == []
    assert [s.n for s in volumes.list_snapshots(repo, "a")] == [1]  # unchanged since: none at unmount


def test_snapshots_by_setfattr_and_at_umount_clone_and_rollback(blank: Repository, tmp_path: Path) -> None:
    store, mnt = blank.path, tmp_path / "mnt"
    mnt.mkdir()
    payload = os.urandom(3 * 65536 + 17)
    try:
        done = casfs(store, "mount", mnt, "--volume", "v")
        assert done.returncode == 0, done.stderr
        (mnt / "kept").write_text("before the first snapshot\n")
        # written, not fsync'd, not even closed: in the kernel's writeback cache
        f = open(mnt / "cached", "wb")  # noqa: SIM115 - closed below, after the snapshot
        try:
            f.write(payload)
            f.flush()
            done = run(["setfattr", "-n", "user.casfs.snapshot", "-v", "with the cache", mnt])
            assert done.returncode == 0, done.stderr
        finally:
            f.close()
        assert xattr(mnt, "user.casfs.snapshots") == "1"
        (mnt / "cached").write_bytes(b"changed after snapshot 1")
        (mnt / "later").write_text("after\n")
        os.setxattr(mnt / "later", "user.mine", b"listed")
        # listxattr shows a file's own names, never the control names
        for p in (mnt, mnt / "later", mnt / "kept"):
            dump = run(["getfattr", "-d", "-m", "-", p]).stdout
            assert "casfs" not in dump
        assert 'user.mine="listed"' in run(["getfattr", "-d", "-m", "-", mnt / "later"]).stdout
        bye = casfs(store, "umount", mnt)
        assert bye.returncode == 0, bye.stderr
        assert bye.stdout.splitlines() == ["snapshot v@2"]
    finally:
        cleanup(mnt, None)
    assert [s.label for s in volumes.list_snapshots(blank, "v")] == ["with the cache", None]
    for name, ref in (("at1", "v@1"), ("at2", "v@2")):
        done = casfs(store, "volume", "create", name, "--from", ref)
        assert done.returncode == 0, done.stderr
    with mounted(store, tmp_path / "at1", volume="at1") as m:
        assert (m.path / "cached").read_bytes() == payload
        assert sorted(os.listdir(m.path)) == ["cached", "kept"]
    with mounted(store, tmp_path / "at2", volume="at2") as m:
        assert (m.path / "cached").read_bytes() == b"changed after snapshot 1"
        assert os.getxattr(m.path / "later", "user.mine") == b"listed"
    # roll v back to 1: a mount then shows that state
    done = casfs(store, "rollback", "v", "1")
    assert done.returncode == 0, done.stderr
    with mounted(store, mnt, volume="v") as m:
        assert sorted(os.listdir(m.path)) == ["cached", "kept"]
        assert (m.path / "cached").read_bytes() == payload
        assert xattr(m.path, "user.casfs.snapshots") == "1 2"
    # the snapshots themselves, read-only under the whole-store mount
    with mounted(store, tmp_path / "whole") as m:
        assert (m.path / "snapshots" / "v" / "1" / "cached").read_bytes() == payload
        assert sorted(os.listdir(m.path / "snapshots" / "v" / "2")) == ["cached", "kept", "later"]


# -- a crash --------------------------------------------------------------------------------------


def test_kill_9_keeps_every_fsynced_byte(blank: Repository, tmp_path: Path) -> None:
    store, mnt = blank.path, tmp_path / "mnt"
    base = os.urandom(4 * 65536)
    with mounted(store, mnt, volume="v") as m:
        (m.path / "old").write_bytes(base)
        (m.path / "doomed").write_text("to be unlinked")
    synced: dict[str, bytes] = {}
    unsynced: dict[str, bytes] = {}
    m = start_daemon(store, mnt, volume="v")
    try:
        top = m.path
        new = bytearray(base)
        new[65536 - 5 : 65536 + 5] = b"X" * 10
        patch(top / "old", 65536 - 5, b"X" * 10)
        synced["old"] = bytes(new)
        for i in range(4):
            data = os.urandom(30_000 * (i + 1))
            (top / "d").mkdir(exist_ok=True)
            with open(top / "d" / f"synced{i}", "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            synced[f"d/synced{i}"] = data
        os.rename(top / "d" / "synced0", top / "renamed")
        synced["renamed"] = synced.pop("d/synced0")
        os.unlink(top / "doomed")
        with open(top / "renamed", "rb+") as f:
            os.fsync(f.fileno())  # one fsync makes every change of the volume durable
        for i in range(3):
            data = os.urandom(100_000)
            with open(top / f"unsynced{i}", "wb") as f:
                f.write(data)
            unsynced[f"unsynced{i}"] = data
        os.kill(m.pid, signal.SIGKILL)
        assert wait_gone(m.pid, m.proc, 30)
        done = run(["fusermount3", "-u", "-z", mnt])
        assert done.returncode == 0, done.stderr
        assert not is_mounted(mnt)
    finally:
        cleanup(mnt, m.pid, m.proc)
    with mounted(store, mnt, volume="v") as m:
        for rel, data in synced.items():
            assert (m.path / rel).read_bytes() == data, rel
        assert not (m.path / "doomed").exists()
        assert not (m.path / "d" / "synced0").exists()
        for rel, data in unsynced.items():  # may or may not have made it; never foreign bytes
            if (m.path / rel).exists():
                got = (m.path / rel).read_bytes()
                assert len(got) <= len(data)
                assert all(g in (d, 0) for g, d in zip(got, data, strict=False)), rel
    fsck_clean(store)
    # the recovered changes became a snapshot at that clean unmount
    assert [s.n for s in volumes.list_snapshots(blank, "v")] == [1, 2]


def test_size_of_a_directory_volume_is_its_files_bytes(blank: Repository, tmp_path: Path) -> None:
    """Issue 7, defect 13: user.casfs.size of a directory volume was the root directory's
    st_size (0); it is the bytes of its regular files (a hardlinked file once)."""
    with mounted(blank.path, tmp_path / "mnt", volume="v") as m:
        (m.path / "a").write_bytes(b"x" * 1000)
        (m.path / "d").mkdir()
        (m.path / "d" / "b").write_bytes(os.urandom(70_000))
        os.link(m.path / "a", m.path / "d" / "a2")
        os.symlink("a", m.path / "s")
        assert xattr(m.path, "user.casfs.size") == "71000"
        os.truncate(m.path / "d" / "b", 5)
        assert xattr(m.path, "user.casfs.size") == "1005"
    assert volumes.get_volume(blank, "v").size == 1005
