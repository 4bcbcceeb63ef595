"""Generate the Python modules of csi.proto: `python -m casfs.csi.proto.regen [OUT_ROOT]`
(casfs.grpcsvc.regen; tests/csi/test_proto.py checks the checked-in ones)."""

from __future__ import annotations

import sys
from pathlib import Path

from casfs.grpcsvc.regen import ROOT, generate, generated_names

HERE = Path(__file__).resolve().parent
PROTOS = [HERE / "csi.proto"]
GENERATED = generated_names(PROTOS[0])

if __name__ == "__main__":
    generate(PROTOS, Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
