"""The read/write volume's shape, checked on the source (casfs/vfs/rw): a core holding
a kind, no inheritance chain, a narrow RwView, and job types the interface does not
import from the implementation."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

VFS = Path(__file__).resolve().parents[2] / "casfs" / "vfs"
RW = VFS / "rw"


def classes(path: Path) -> dict[str, ast.ClassDef]:
    tree = ast.parse(path.read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def members(cls: ast.ClassDef) -> set[str]:
    """Methods, properties and attributes a class defines (in its body, or set on self
    in __init__)."""
    found = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            for sub in ast.walk(node):
                targets = (
                    sub.targets
                    if isinstance(sub, ast.Assign)
                    else [sub.target]
                    if isinstance(sub, ast.AnnAssign)
                    else []
                )
                found |= {
                    t.attr for t in targets if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"
                }
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return found - {"__init__"}


def methods(cls: ast.ClassDef) -> set[str]:
    return {n.name for n in cls.body if isinstance(n, ast.FunctionDef)} - {"__init__"}


VOLUME = {
    "RwVolume": classes(RW / "volume.py")["RwVolume"],
    "DirKind": classes(RW / "dirkind.py")["DirKind"],
    "DirNames": classes(RW / "names.py")["DirNames"],
    "BlockKind": classes(RW / "blockkind.py")["BlockKind"],
}
KIND = members(classes(RW / "kind.py")["Kind"])


def test_rw_view_is_narrow() -> None:
    api = classes(VFS / "api.py")
    own = members(api["RwView"])
    assert len(own) <= 30, sorted(own)
    assert "prepare_snapshot" in own and not any(m.startswith(("run_", "apply_", "abort_")) for m in own)


def test_the_interface_imports_nothing_of_the_implementation() -> None:
    """Not even for types: the job types are the Job protocol's, stated in api.py."""
    tree = ast.parse((VFS / "api.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in imported if m.startswith(("casfs.vfs.", "casfs.fuse"))}


def test_no_class_of_the_volume_inherits_another() -> None:
    """Every class under vfs/rw stands alone (Protocols are interfaces, not parents)."""
    wrong = []
    for path in RW.rglob("*.py"):
        for name, cls in classes(path).items():
            bases = {ast.unparse(b) for b in cls.bases} - {"Protocol"}
            if bases:
                wrong.append((path.name, name, bases))
    assert wrong == []


def test_no_method_is_defined_in_two_classes_of_the_volume() -> None:
    """The core, the directory kind's names and each kind share no method name: a
    behaviour lives in one place. The two kinds share exactly the Kind protocol, each
    implementing it once."""
    for (a, ca), (b, cb) in itertools.combinations(VOLUME.items(), 2):
        shared = methods(ca) & methods(cb)
        if {a, b} == {"DirKind", "BlockKind"}:
            assert shared <= KIND, (a, b, shared - KIND)
        else:
            assert shared == set(), (a, b, shared)


def test_the_kinds_implement_the_whole_kind_protocol() -> None:
    for name in ("DirKind", "BlockKind"):
        assert members(VOLUME[name]) >= KIND, (name, KIND - members(VOLUME[name]))


def test_one_module_per_job_kind() -> None:
    jobs = {p.stem for p in (RW / "jobs").glob("*.py")}
    assert {"flush", "sync", "fold_dir", "fold_block", "freeze", "frozen_fold"} <= jobs
    for stem in ("flush", "sync", "fold_dir", "fold_block", "freeze", "frozen_fold"):
        job_classes = [c for c in classes(RW / "jobs" / f"{stem}.py").values() if not c.name.startswith("_")]
        assert len(job_classes) == 1, stem
        assert {"run", "apply", "abort", "what", "slot"} <= members(job_classes[0]), stem


def test_no_module_of_the_vfs_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(VFS)): n for p in VFS.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}
