"""Generate the Python modules of csi.proto (protoc through grpcio-tools, and the .pyi
type stubs through mypy-protobuf): `python -m casfs.csi.proto.regen [OUT_ROOT]`.

The generated modules are checked in, so that neither an install nor CI needs a code
generator; tests/csi/test_proto.py generates them again into a temporary directory and
compares. Run from anywhere: paths are the package's own."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]  # the directory holding casfs/: protoc names modules from it
PROTO = HERE.relative_to(ROOT) / "csi.proto"
GENERATED = ("csi_pb2.py", "csi_pb2.pyi", "csi_pb2_grpc.py", "csi_pb2_grpc.pyi")


def generate(out_root: Path) -> list[Path]:
    """Write the generated files under out_root/casfs/csi/proto/; their paths."""
    import grpc_tools
    from grpc_tools import protoc

    includes = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto
    out_root.mkdir(parents=True, exist_ok=True)
    plugin_dir = Path(sys.executable).parent  # protoc-gen-mypy, beside this interpreter
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{includes}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--plugin=protoc-gen-mypy={plugin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={plugin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        str(ROOT / PROTO),
    ]
    status = protoc.main(args)
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}")
    return [out_root / PROTO.parent / name for name in GENERATED]


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
