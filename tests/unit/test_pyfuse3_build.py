"""The pyfuse3 the daemon runs is the one scripts/build-pyfuse3.sh builds: 3.5.0 with the
read reply written without the GIL and, against libfuse 3.17+ (the system's, or the one
scripts/build-libfuse.sh builds from Debian's source), FUSE passthrough, marked by a
local version label. A plain `pip install pyfuse3` works too, only slower and without
passthrough; this checks that the install scripts did put casfs's build in place."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from casfs.fuse import fastwait, passthrough

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-pyfuse3.sh"


def _script_value(name: str) -> str:
    found = re.search(rf"^{name}=(\S+)", SCRIPT.read_text(), re.MULTILINE)
    assert found, f"{name}= not found in {SCRIPT}"
    return found.group(1)


def test_the_installed_pyfuse3_is_the_patched_build() -> None:
    version = _script_value("VERSION")
    label = _script_value("LABEL").replace("$VERSION", version)
    assert metadata.version("pyfuse3") == f"{label}.passthrough", (
        "run scripts/install.sh: it builds pyfuse3 against libfuse 3.17+ (its warning says why not)"
    )
    assert passthrough.built_in()
    assert fastwait.checked(metadata.version("pyfuse3"))


def test_the_patched_build_is_of_the_version_the_fast_wait_was_checked_against() -> None:
    assert _script_value("VERSION") == fastwait.VERSION
