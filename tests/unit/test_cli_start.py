"""What a short command imports. Orchestrators run the CLI once per volume, so its
start-up is most of what a clone costs them (benchmarks/cli_start.py times it); these
tests check the modules loaded, not the time, so they hold on a busy machine.

    the parser alone imports no command's module (each is imported when its command runs)
    and none of the mount's or the codecs' libraries
    commands that read no compressed blob import neither trio, pyfuse3 nor zstandard;
    listings without --json and a delete not json
    a clone, a snapshot at rest or a delete loads neither the tree and map codecs, gc
    nor the job queue; a clone not the blob store, casfs.images, the migrations,
    dataclasses (inspect), pathlib, shutil, logging
    the catalog's row tuples have no string annotations (typing would compile() them)
    a pull loads none of the source's side, and `serve-replica` (started on the source
    for a pull) none of the receiver's nor of the volumes' code
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import ForwardRef

import pytest

from casfs.cli.grammar import GRAMMAR, LazyCommand
from casfs.images import import_image
from casfs.repo import Repository
from casfs.volumes import Source, create_snapshot, create_volume
from tests.helpers.cli import RUN_IN_PROBE, env, ok
from tests.helpers.mount import cleanup

HEAVY = ("trio", "pyfuse3", "zstandard")
COMMAND_MODULES = tuple(f"casfs.cli.{m}" for m in ("images", "maintenance", "mounts", "snapshots", "volumes"))
# What a clone (of an image or a snapshot) or a delete has no use for.
NOT_FOR_A_CLONE = (
    "casfs.snapshots.tree",
    "casfs.snapshots.chunkmap",
    "casfs.refcount.gc",
    "casfs.lifecycle.queue",
)


# What a clone (it touches only the catalog) has no use for either: the blob store is
# made at first use (Repository.blobs), Path too (Repository.path); the info it returns
# is no dataclass (which imports inspect); the migrations run only on an old store.
NOT_FOR_A_CLONE_START = (
    "casfs.images",
    "casfs.store.packstore",
    "casfs.store.local",
    "casfs.catalog.migrate",
    "dataclasses",
    "inspect",
    "pathlib",
    "shutil",
    "logging",
    "argparse",  # (a plain command line: casfs.cli.quick)
    "gettext",
)
# ...and a clone of an image no other part of casfs.volumes (imported name by name).
NOT_FOR_AN_IMAGE_CLONE = ("casfs.volumes.rollback", "casfs.volumes.snapshots", "casfs.volumes.settle")


# `casfs -s STORE ARGS...` run as a module, in the probing interpreter.
RUN_CASFS = "sys.argv = ['casfs', '-s', *sys.argv[1:]]\n" + RUN_IN_PROBE + "assert not code, code"


def loaded(code: str, *argv: str, probe: tuple[str, ...]) -> list[str]:
    """Run `code` in a fresh interpreter (sys.argv[1:] = argv); which of `probe` it loaded."""
    script = f"import sys\n{code}\nprint('loaded:', sorted(m for m in {probe!r} if m in sys.modules))\n"
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=60, env=env()
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("loaded: ")]
    assert done.returncode == 0 and lines, (done.stdout, done.stderr)
    return list(ast.literal_eval(lines[-1].removeprefix("loaded: ")))


def test_the_program_collects_garbage_again_once_started(store: Path) -> None:
    """(casfs.__main__ turns the collector off for the start-up only: a command may
    run for hours.)"""
    code = RUN_CASFS + "\nimport gc\nif not gc.isenabled():\n    sys.modules['collector off'] = sys"
    assert loaded(code, str(store), "volume", "ls", probe=("collector off",)) == []


def test_every_command_in_the_grammar_names_a_function() -> None:
    """(A row names its function by module and name, resolved only when it runs: a typo
    would otherwise show only when someone runs that command.)"""
    for row in GRAMMAR:
        assert isinstance(row.func, LazyCommand), row.noun
        assert callable(row.func.resolve()), (row.noun, row.verb)


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["volume", "create", "c", "--from", "img"],
        ["volume", "ls"],
        ["snapshot", "ls", "v"],
        ["image", "import", "i", "/x"],
        ["mount", "/mnt"],
    ],
)
def test_the_parser_imports_no_command_module(argv: list[str]) -> None:
    code = "from casfs.cli.parser import parse\ntry:\n    parse(sys.argv[1:])\nexcept SystemExit:\n    pass"
    assert loaded(code, *argv, probe=HEAVY + COMMAND_MODULES) == []


@pytest.mark.parametrize(
    ("argv", "absent"),
    [
        (["--version"], HEAVY),
        (["volume", "ls"], (*HEAVY, "json")),
        (["volume", "info", "v"], (*HEAVY, "json")),
        (["snapshot", "ls", "v"], (*HEAVY, "json")),
        (["image", "ls"], HEAVY),
        (["snapshot", "create", "v"], HEAVY + NOT_FOR_A_CLONE),
        (
            ["volume", "create", "c", "--from", "img"],
            HEAVY + NOT_FOR_A_CLONE + NOT_FOR_A_CLONE_START + NOT_FOR_AN_IMAGE_CLONE,
        ),
        (["volume", "create", "c", "--from", "v@1"], HEAVY + NOT_FOR_A_CLONE + NOT_FOR_A_CLONE_START),
        (["volume", "rm", "v"], (*HEAVY, *NOT_FOR_A_CLONE, "json")),
    ],
)
def test_short_commands_load_only_what_they_use(
    store: Path, tmp_path: Path, argv: list[str], absent: tuple[str, ...]
) -> None:
    """On a store of block volumes made from random bytes: their chunk maps do not
    compress, so they are stored raw and a listing decodes nothing. (Listing directory
    volumes reads their trees, which compress: that loads zstandard, as it must.)"""
    raw = tmp_path / "img.raw"
    raw.write_bytes(os.urandom(256 << 10))
    with contextlib.closing(Repository.open(store)) as repo:  # (the set-up in process: faster)
        import_image(repo, "img", raw)
        create_volume(repo, "v", Source(image="img"))
        create_snapshot(repo, "v")
    assert loaded(RUN_CASFS, str(store), *argv, probe=absent) == []


def test_the_catalog_rows_have_no_string_annotations() -> None:
    """typing.NamedTuple compile()s a string annotation (a ForwardRef), and the first
    compile() in a process costs every command that opens a store 3 ms: the catalog's
    modules do without `from __future__ import annotations`."""
    import casfs.catalog
    from casfs.catalog import blobs, images, overlay, volumes

    rows = [
        v
        for m in (casfs.catalog, blobs, images, overlay, volumes)
        for v in vars(m).values()
        if isinstance(v, type) and issubclass(v, tuple) and hasattr(v, "_fields")
    ]
    assert len(rows) >= 5
    for row in rows:
        assert not any(isinstance(t, str | ForwardRef) for t in row.__annotations__.values()), row


# What a copying pull (the receiver) and its server (the source) have no use for.
NOT_FOR_A_PULL = (
    *HEAVY[:2],
    "casfs.replica.serve",
    "casfs.replica.stream",
    "casfs.replica.walk",
    "casfs.replica.adopt",
    "casfs.volumes",
)
NOT_FOR_A_SERVER = (
    *HEAVY[:2],
    "casfs.replica.assemble",
    "casfs.replica.pull",
    "casfs.replica.stream",
    "casfs.volumes",
    "casfs.snapshots.tree",
    "casfs.snapshots.chunkmap",
    "uuid",
)


def _source(store: Path, tmp_path: Path) -> None:
    raw = tmp_path / "img.raw"
    raw.write_bytes(os.urandom(256 << 10))
    with contextlib.closing(Repository.open(store)) as repo:
        import_image(repo, "img", raw)
        create_volume(repo, "v", Source(image="img"))
        create_snapshot(repo, "v")


def test_a_pull_and_its_server_load_only_their_side(store: Path, tmp_path: Path) -> None:
    """Both start for every pull over ssh that finds no server up (replica.sharing)."""
    _source(store, tmp_path)
    here = tmp_path / "here"
    ok(here, "init")
    assert loaded(RUN_CASFS, str(here), "pull", str(store), "v", probe=NOT_FOR_A_PULL) == []
    assert _served(store, "serve-replica", str(store)) == b""


def test_a_server_kept_up_starts_as_a_server_does(store: Path, tmp_path: Path) -> None:
    """`serve-replica --listen --stdio` (what a pull over ssh starts when it finds no
    server up) loads no more than `serve-replica` while it serves that pull, nor
    tempfile (where $XDG_RUNTIME_DIR names its directory); its server is ended by pid."""
    from casfs.lifecycle.pids import alive
    from casfs.replica.land import store_id

    _source(store, tmp_path)
    with contextlib.closing(Repository.open(store)) as repo:
        store_id(repo)  # (made at a store's first pull: uuid, imported then only)
    run = Path(tempfile.mkdtemp(prefix="casfs-run-"))  # (short: a socket's path)
    argv = ("serve-replica", "--listen", "probe", "--idle", "60", "--stdio", str(store))
    try:
        said = _served(store, *argv, probe=("tempfile",), XDG_RUNTIME_DIR=str(run))
        pid = int((run / "casfs-ssh" / "probe.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert said == f"listening {run / 'casfs-ssh' / 'probe.sock'}\n".encode()
        assert not alive(pid) and list((run / "casfs-ssh").iterdir()) == []
    finally:
        for pid_file in (run / "casfs-ssh").glob("*.pid"):  # (a failure above: the server ended)
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
        shutil.rmtree(run, ignore_errors=True)


def _served(store: Path, *argv: str, probe: tuple[str, ...] = (), **extra: str) -> bytes:
    """Run `casfs ARGV` as a server, asked what a pull asks (hello, the volume, the offer,
    then its root): checks it answered all and loaded none of NOT_FOR_A_SERVER (nor
    `probe`); returns what it wrote before the frames."""
    from casfs.kinds import BlobKind
    from casfs.replica.protocol import FRAME, WANT, frame

    with contextlib.closing(Repository.open(store)) as repo:
        (root,) = repo.conn.execute("SELECT root FROM snapshots WHERE volume = 'v'").fetchone()
    requests = b"".join(
        frame(b"Q", json.dumps(q).encode())
        for q in ({"op": "hello"}, {"op": "volume", "name": "v"}, {"op": "offer", "name": "v", "n": 1})
    ) + frame(b"G", WANT.pack(bytes(root), BlobKind.MAP_ROOT))
    absent = (*NOT_FOR_A_SERVER, *probe)
    script = (
        "import sys\nsys.argv = ['casfs', *sys.argv[1:]]\n" + RUN_IN_PROBE + "assert not code, code\n"
        f"print('loaded:', sorted(m for m in {absent!r} if m in sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *argv],
        input=requests,
        capture_output=True,
        timeout=60,
        env=env(**extra),
    )
    said = done.stderr.decode().splitlines()
    assert done.returncode == 0 and said and said[-1] == "loaded: []", (done.returncode, said)
    line = done.stdout[: done.stdout.index(b"\n") + 1] if done.stdout.startswith(b"listening ") else b""
    tags, at = [], len(line)
    while at < len(done.stdout):
        tag, length = FRAME.unpack_from(done.stdout, at)
        tags.append(tag)
        at += FRAME.size + length
    assert tags == [b"R", b"R", b"R", b"b", b"."]  # (answered, and the root sent)
    return line


def test_a_background_mount_loads_no_trio_in_the_cli(store: Path, tmp_path: Path) -> None:
    """`casfs mount` starts the daemon and waits for it: the daemon imports trio and
    pyfuse3, the CLI process need not (a mount's start-up would pay for them twice)."""
    with contextlib.closing(Repository.open(store)) as repo:
        create_volume(repo, "b", Source(blank_block=1 << 20))
    target = tmp_path / "b.raw"
    target.touch()
    try:
        assert loaded(RUN_CASFS, str(store), "mount", str(target), "--volume", "b", probe=HEAVY[:2]) == []
        assert target.stat().st_size == 1 << 20  # (mounted: the volume's size)
        ok(store, "umount", target)  # (waits for the daemon to exit)
        # --foreground serves in the CLI's own process (trio and pyfuse3 loaded there).
        cmd = [sys.executable, "-m", "casfs", "-s", str(store), "mount", str(target), "--volume", "b"]
        log = tmp_path / "fg.log"
        with log.open("wb") as err, subprocess.Popen([*cmd, "--foreground"], env=env(), stderr=err) as fg:
            try:
                deadline = time.monotonic() + 30
                while target.stat().st_size != 1 << 20 and fg.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert target.stat().st_size == 1 << 20, log.read_text()
                ok(store, "umount", target)
                assert fg.wait(timeout=30) == 0, log.read_text()
            finally:
                if fg.poll() is None:
                    fg.kill()
    finally:
        cleanup(target, None)
