"""Generate the Python modules of a package's .proto files (protoc through grpcio-tools,
the .pyi type stubs through mypy-protobuf).

The generated modules are checked in, so that neither an install nor CI needs a code
generator; each service's test generates them again into a temporary directory and
compares (`stale`). Paths are named from the directory holding casfs/, as protoc names
the modules from it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the directory holding casfs/


def generated_names(proto: Path) -> tuple[str, ...]:
    stem = proto.stem
    return (f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py", f"{stem}_pb2_grpc.pyi")


def generate(protos: list[Path], out_root: Path) -> list[Path]:
    """Write the generated files of `protos` (absolute paths under ROOT) under out_root,
    at their packages' paths; their paths."""
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
        *(str(p) for p in protos),
    ]
    status = protoc.main(args)
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}")
    return [out_root / p.relative_to(ROOT).parent / name for p in protos for name in generated_names(p)]


def stale(protos: list[Path], out_root: Path) -> list[str]:
    """The checked-in generated files that differ from a fresh generation into out_root."""
    made = generate(protos, out_root)
    return [
        str(p.relative_to(out_root))
        for p in made
        if p.read_bytes() != (ROOT / p.relative_to(out_root)).read_bytes()
    ]
