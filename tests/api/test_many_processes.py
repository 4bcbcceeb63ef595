"""Many CLI processes on one store at once: imports (some of content that another
command is freeing), volume creates, snapshots, deletes, gc and fsck, all started
together. Each must succeed, and the store must then be consistent (fsck clean, no
orphan files) and hold exactly what the commands made."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.helpers.cli import CLI, env, js, ok
from tests.helpers.fsck import assert_consistent

CHUNK = 64 << 10


def test_concurrent_commands_leave_a_consistent_store(store: Path, tmp_path: Path) -> None:
    shared = os.urandom(16 * CHUNK)
    base = tmp_path / "base.raw"
    base.write_bytes(shared + os.urandom(8 * CHUNK))
    ok(store, "image", "import", "base", str(base))
    doomed = tmp_path / "doomed.raw"
    doomed.write_bytes(os.urandom(12 * CHUNK))
    ok(store, "image", "import", "doomed", str(doomed))
    for v in ("old1", "old2", "gone"):
        ok(store, "volume", "create", v, "--from", "base")
    sources = []
    for i in range(4):  # half shared with base, half new
        sources.append(tmp_path / f"new{i}.raw")
        sources[-1].write_bytes(shared + os.urandom(8 * CHUNK))

    commands = [
        *[["image", "import", f"new{i}", str(src)] for i, src in enumerate(sources)],
        ["image", "rm", "doomed"],
        ["image", "import", "again", str(doomed)],  # the content image rm + gc are freeing
        *[["volume", "create", f"clone{i}", "--from", "base"] for i in range(4)],
        ["volume", "create", "blank", "--blank-block", "1G"],
        ["volume", "create", "eph", "--blank-dir", "--grace", "1h"],
        ["snapshot", "create", "old1"],
        ["snapshot", "create", "old2", "--label", "x"],
        ["volume", "rm", "gone"],
        ["gc"],
        ["gc"],
        ["fsck", "--sample", "0.5"],
    ]
    procs = [
        subprocess.Popen(
            [*CLI, "-s", str(store), *cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        for cmd in commands
    ]
    failures = []
    try:
        for cmd, p in zip(commands, procs, strict=True):
            _, err = p.communicate(timeout=120)
            if p.returncode != 0:
                failures.append((cmd, p.returncode, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert failures == []

    ok(store, "gc")
    assert_consistent(store)
    images = {i["name"]: i for i in js(store, "image", "ls")}
    assert sorted(images) == ["again", "base", "new0", "new1", "new2", "new3"]
    assert {i["phase"] for i in images.values()} == {"ready"}
    volumes = {v["name"]: v for v in js(store, "volume", "ls")}
    assert sorted(volumes) == ["blank", "clone0", "clone1", "clone2", "clone3", "eph", "old1", "old2"]
    assert (volumes["old1"]["snapshots"], volumes["old2"]["snapshots"]) == ([1], [1])
    ok(store, "image", "export", "again", str(tmp_path / "again.raw"))
    assert (tmp_path / "again.raw").read_bytes() == doomed.read_bytes()
