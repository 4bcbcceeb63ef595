"""containerd (Debian's, real) on casfs: `ctr` imports an image, runs containers with runc
on casfs rootfs volumes, commits one; an image casfs holds is imported without an unpack.
One containerd and one snapshotter for the module; each test cleans up what it ran."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from casfs.fuse.mountinfo import find_mount
from tests.helpers.fsck import query
from tests.oci.build import umoci_unpack
from tests.oci.compare import differences, manifest
from tests.snapshotter.build import HELLO
from tests.snapshotter.conftest import Image
from tests.snapshotter.stack import REF, Stack


@pytest.fixture(scope="module")
def imported(stack: Stack, image: Image) -> Stack:
    out = stack.ctr(
        "images", "import", "--snapshotter", "casfs", "--base-name", "example.com/bb", str(image.tar)
    )
    assert "done" in out
    return stack


def run(s: Stack, name: str, *cmd: str, namespace: str = "default") -> str:
    return s.ctr("run", "--rm", "--snapshotter", "casfs", REF, name, *cmd, namespace=namespace)


def active_keys(s: Stack) -> list[str]:
    return sorted(k for k, r in s.records().items() if r["kind"] != "committed")


def top_of(s: Stack, namespace: str = "default") -> str:
    """The image's top layer snapshot (the one with a parent: the image has two layers)."""
    info = [
        json.loads(s.ctr("snapshots", "--snapshotter", "casfs", "info", k, namespace=namespace))
        for k in s.snapshots(namespace)
    ]
    return str(next(i["Name"] for i in info if i.get("Parent") and i["Kind"] == "Committed"))


def stored(s: Stack) -> int:
    """Bytes of every blob in the store."""
    return int(query(s.store, "SELECT stored FROM blob_totals")[0][0])


def wait_released(s: Stack) -> None:
    """containerd's gc has removed the snapshots of the containers the test deleted."""
    s.gc()
    s.wait("active snapshots removed", lambda: active_keys(s) == [])


def test_import_then_run_reads_and_writes_its_rootfs(imported: Stack) -> None:
    s = imported
    assert run(s, "first") == HELLO  # (the image's default command)
    out = run(
        s, "second", "/bin/sh", "-c", "echo written > /data/w; cat /data/w; cat /etc/hello.txt; ls /etc"
    )
    assert out == f"written\n{HELLO}hello.txt\n"  # (layer 2's whiteout of etc/gone.txt applied)
    wait_released(s)
    # containerd's view and casfs's agree: two committed layers, each a casfs snapshot
    listed = s.snapshots()
    assert sorted(listed.values()) == ["Committed", "Committed"]
    records = s.records()
    assert sorted(r["kind"] for r in records.values()) == ["committed", "committed"]
    volumes = s.volumes()
    assert {r["volume"] for r in records.values()} == set(volumes)
    assert all(len(v["snapshots"]) == 1 for v in volumes.values())
    top = top_of(s)
    info = json.loads(s.ctr("snapshots", "--snapshotter", "casfs", "info", top))
    assert info["Kind"] == "Committed" and info["Parent"] in listed
    usage = s.ctr("snapshots", "--snapshotter", "casfs", "usage", "-b", top).splitlines()[1].split()
    assert int(usage[1]) >= 1 << 20  # (layer 2's 1 MiB file is its own) and inodes counted
    assert int(usage[2]) > 3


def test_the_store_mount_is_suid_as_overlayfs_is(imported: Stack) -> None:
    """A container's setuid programs and file capabilities work (FUSE mounts are nosuid
    unless asked; tests/mount/test_file_caps.py checks what --suid does at exec)."""
    assert run(imported, "suid") == HELLO
    store = find_mount(str(imported.store_mount))
    assert store is not None and store.is_casfs
    assert "nosuid" not in store.options.split(","), store.options
    wait_released(imported)


def test_a_second_container_is_a_clone_sharing_every_blob(imported: Stack) -> None:
    s = imported
    before = stored(s)
    s.ctr("run", "-d", "--snapshotter", "casfs", REF, "long1", "/bin/sleep", "1000")
    s.ctr("run", "-d", "--snapshotter", "casfs", REF, "long2", "/bin/sleep", "1000")
    try:
        assert stored(s) - before < 64 << 10  # (two clones: no file data stored)
        mine = {r["volume"] for k, r in s.records().items() if k.endswith(("/long1", "/long2"))}
        actives = [v for v in s.volumes().values() if v["name"] in mine]
        assert len(actives) == 2 and len({v["origin"] for v in actives}) == 1
        assert actives[0]["origin"].startswith("snapshot:")
        assert all(v["written"] == 0 for v in actives)
        s.ctr("tasks", "exec", "--exec-id", "w", "long1", "/bin/sh", "-c", "echo mine > /data/only1")
        assert s.ctr("tasks", "exec", "--exec-id", "r", "long1", "/bin/cat", "/data/only1") == "mine\n"
        seen = s.ctr("tasks", "exec", "--exec-id", "r", "long2", "/bin/ls", "/data")
        assert seen == "big.bin\n"
    finally:
        for c in ("long1", "long2"):
            s.end(c)
    wait_released(s)


def test_a_committed_container_snapshot_runs_a_new_container(imported: Stack, tmp_path: Path) -> None:
    s = imported
    s.ctr("run", "--snapshotter", "casfs", REF, "tocommit", "/bin/sh", "-c", "echo kept > /data/committed")
    s.ctr("snapshots", "--snapshotter", "casfs", "commit", "committed-one", "tocommit")
    s.ctr("containers", "delete", "tocommit")
    assert s.snapshots()["committed-one"] == "Committed"
    # a new container on a snapshot of the commit (ctr runs an image's or a directory)
    s.ctr("snapshots", "--snapshotter", "casfs", "prepare", "from-commit", "committed-one")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    how = s.ctr("snapshots", "--snapshotter", "casfs", "mounts", str(rootfs), "from-commit").split()
    assert how[:3] == ["mount", "-t", "bind"]
    subprocess.run(how, check=True)
    try:
        out = s.ctr("run", "--rm", "--rootfs", str(rootfs), "on-commit", "/bin/sh", "-c",
                    "cat /data/committed; echo second > /data/second")  # fmt: skip
        assert out == "kept\n"
    finally:
        subprocess.run(["umount", str(rootfs)], check=True)
    # committed in turn: a chain of its own (image layers, committed-one, committed-two)
    s.ctr("snapshots", "--snapshotter", "casfs", "commit", "committed-two", "from-commit")
    info = json.loads(s.ctr("snapshots", "--snapshotter", "casfs", "info", "committed-two"))
    assert (info["Kind"], info["Parent"]) == ("Committed", "committed-one")
    s.ctr("snapshots", "--snapshotter", "casfs", "prepare", "from-two", "committed-two")
    how = s.ctr("snapshots", "--snapshotter", "casfs", "mounts", str(rootfs), "from-two").split()
    subprocess.run(how, check=True)
    try:
        out = s.ctr("run", "--rm", "--rootfs", str(rootfs), "on-two", "/bin/cat", "/data/committed",
                    "/data/second", "/etc/hello.txt")  # fmt: skip
        assert out == f"kept\nsecond\n{HELLO}"
    finally:
        subprocess.run(["umount", str(rootfs)], check=True)
    s.ctr("snapshots", "--snapshotter", "casfs", "rm", "from-two")
    s.ctr("snapshots", "--snapshotter", "casfs", "rm", "committed-two")
    # containerd's rule, casfs's answer: a parent with children is not removed
    s.ctr("snapshots", "--snapshotter", "casfs", "prepare", "child", "committed-one")
    refused = s.ctr("snapshots", "--snapshotter", "casfs", "rm", "committed-one", check=False)
    assert "failed precondition" in refused.lower() or "children" in refused
    s.ctr("snapshots", "--snapshotter", "casfs", "rm", "child")
    s.ctr("snapshots", "--snapshotter", "casfs", "rm", "committed-one")
    assert "committed-one" not in s.snapshots()
    wait_released(s)


def test_an_image_casfs_holds_is_imported_without_unpacking(
    imported: Stack, image: Image, tmp_path: Path
) -> None:
    s = imported
    s.casfs("image", "import", "bbheld", f"oci:{image.layout}:v1")
    primed = json.loads(s.casfs("snapshotter", "prime", "bbheld", "--containerd", f"unix://{s.containerd_socket}",
                                "--namespace", "held", "--json"))  # fmt: skip
    assert [p["already"] for p in primed] == [False, False]
    log_before = len(s.log())
    s.ctr(
        "images",
        "import",
        "--snapshotter",
        "casfs",
        "--base-name",
        "example.com/bb",
        str(image.tar),
        namespace="held",
    )
    assert "extract-" not in s.log()[log_before:]  # (no layer was prepared to be applied)
    held = s.snapshots(namespace="held")
    assert sorted(held.values()) == ["Committed", "Committed"]
    assert run(s, "held1", namespace="held") == HELLO
    # its rootfs is the image's, as umoci unpacks it (ctr's view is not a gc root: a prepare is)
    s.ctr("snapshots", "--snapshotter", "casfs", "prepare", "held-view", top_of(s, "held"), namespace="held")
    rootfs = tmp_path / "view"
    rootfs.mkdir()
    how = s.ctr(
        "snapshots", "--snapshotter", "casfs", "mounts", str(rootfs), "held-view", namespace="held"
    ).split()
    subprocess.run(how, check=True)
    try:
        want = manifest(umoci_unpack(image.layout, "v1", tmp_path / "bundle"))
        assert differences(manifest(rootfs), want) == []
    finally:
        subprocess.run(["umount", str(rootfs)], check=True)
    s.ctr("snapshots", "--snapshotter", "casfs", "rm", "held-view", namespace="held")
    wait_released(s)
