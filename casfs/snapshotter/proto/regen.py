"""Generate the Python modules of snapshots.proto, mount.proto and leases.proto:
`python -m casfs.snapshotter.proto.regen [OUT_ROOT]` (casfs.grpcsvc.regen;
tests/snapshotter/test_proto.py checks the checked-in ones)."""

from __future__ import annotations

import sys
from pathlib import Path

from casfs.grpcsvc.regen import ROOT, generate

HERE = Path(__file__).resolve().parent
PROTOS = [HERE / "leases.proto", HERE / "mount.proto", HERE / "snapshots.proto"]

if __name__ == "__main__":
    generate(PROTOS, Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
