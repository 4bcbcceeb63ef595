"""`casfs volume bundle`: a volume made from an OCI image, mounted, becomes a runtime
bundle whose config.json runs the image's entrypoint + cmd with its env, working dir
and user; `runc run` of it prints what the image's command prints."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from casfs.errors import UsageError
from casfs.importers.oci.runtime import resolve_user
from tests.helpers.cli import fails, ok, run
from tests.helpers.mount import cleanup, is_mounted, mounted
from tests.oci import build
from tests.oci.conftest import Sample

needs_runc = pytest.mark.skipif(
    shutil.which("runc") is None or os.geteuid() != 0, reason="runc, as root (scripts/install.sh)"
)


def config_of(bundle: Path) -> dict[str, object]:
    return dict(json.loads((bundle / "config.json").read_text()))


@needs_runc
def test_runc_runs_the_images_command(store: Path, tmp_path: Path, sample: Sample) -> None:
    ok(store, "image", "import", "s", f"oci:{sample.layout}:v1")
    ok(store, "volume", "create", "c1", "--from", "s")
    bundle, state = tmp_path / "bundle", tmp_path / "runc-state"
    rootfs = bundle / "rootfs"
    try:
        ok(store, "volume", "bundle", "c1", str(bundle))
        assert is_mounted(rootfs)
        config = config_of(bundle)
        process = config["process"]
        assert isinstance(process, dict)
        assert process["args"] == ["/bin/sh", "/app/run.sh", "one", "two"]
        assert process["env"] == [f"GREETING={build.GREETING}", "PATH=/bin", "HOME=/root"]
        assert (process["cwd"], process["user"]) == ("/data", {"uid": 0, "gid": 0})
        assert config["root"] == {"path": str(rootfs), "readonly": False}
        # a second bundle call finds the volume mounted there already
        ok(store, "volume", "bundle", "c1", str(bundle))
        done = run(["runc", "--root", state, "run", "-b", bundle, "casfs-test-c1"], timeout=60)
        assert (done.returncode, done.stdout) == (0, build.PRINTS), done.stderr
    finally:
        run(["runc", "--root", state, "delete", "-f", "casfs-test-c1"])
        if is_mounted(rootfs) and ok(store, "umount", str(rootfs)).returncode:
            cleanup(str(rootfs), None)


def test_a_mounted_volume_and_a_clone_of_its_snapshot(store: Path, tmp_path: Path, sample: Sample) -> None:
    ok(store, "image", "import", "s", f"oci:{sample.layout}:v1")
    ok(store, "volume", "create", "c1", "--from", "s")
    ok(store, "snapshot", "create", "c1")
    ok(store, "volume", "create", "c2", "--from", "c1@1")
    with mounted(store, tmp_path / "mnt", volume="c2") as m:
        ok(store, "volume", "bundle", "c2", str(tmp_path / "b"), "--rootfs", str(m.path))
        config = config_of(tmp_path / "b")
        assert config["root"] == {"path": str(m.path), "readonly": False}
        assert config["hostname"] == "c2" and config["annotations"] == {"org.example.name": "sample"}
    assert not (tmp_path / "b" / "rootfs").exists()


def test_a_volume_not_from_an_oci_image(store: Path, tmp_path: Path) -> None:
    ok(store, "volume", "create", "blank", "--blank-dir")
    line = fails(store, 2, "volume", "bundle", "blank", str(tmp_path / "b"))
    assert "was not made from an OCI image" in line
    fails(store, 3, "volume", "bundle", "nope", str(tmp_path / "b"))


def test_users_resolve_in_the_images_passwd(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text(
        "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n"
    )
    (tmp_path / "etc" / "group").write_text("root:x:0:\nstaff:x:50:\n")
    assert resolve_user("", tmp_path) == (0, 0, "/root")
    assert resolve_user("app", tmp_path) == (1000, 1001, "/home/app")
    assert resolve_user("app:staff", tmp_path) == (1000, 50, "/home/app")
    assert resolve_user("1000:7", tmp_path) == (1000, 7, "/home/app")
    assert resolve_user("4242", tmp_path) == (4242, 0, "/")
    with pytest.raises(UsageError, match="'nobody' is not in its /etc/passwd"):
        resolve_user("nobody", tmp_path)
    with pytest.raises(UsageError, match="group 'wheel'"):
        resolve_user("app:wheel", tmp_path)
