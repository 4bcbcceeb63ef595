"""The import rules, checked on the source: every `import` of casfs/ (at module level or
inside a function; `if TYPE_CHECKING:` blocks aside, as they never run) must point down.

    no cycles among casfs's modules
    casfs.ids, casfs.kinds  (the numbers and kinds every layer names) import nothing of casfs
    casfs.sqlitewal  (opening a SQLite file, for the store and the catalog) neither
    casfs.store      imports only casfs.errors, casfs.sqlitewal and casfs.store
    casfs.snapshots  imports only casfs.errors, casfs.ids, casfs.kinds, casfs.store and casfs.snapshots
    casfs.catalog    imports only casfs.errors, casfs.ids, casfs.kinds, casfs.sqlitewal, casfs.store (ids)
                     and casfs.catalog
    casfs.vfs        never imports casfs.fuse, casfs.volumes, casfs.images or casfs.cli
    only casfs.fuse imports pyfuse3; trio only casfs.fuse and casfs.vfs; grpc and protobuf
                     only casfs.csi
    commands that do not mount import neither trio nor pyfuse3, nor grpc (checked by running them)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import RUN_IN_PROBE, ok

ROOT = Path(__file__).resolve().parents[2] / "casfs"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for n in ast.walk(node)}
    return skipped


def imported(path: Path) -> Iterator[str]:
    """Every module name an import in the file names (a `from m import x` names m.x when
    that is a module of casfs, else m)."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield full if full in MODULES else node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def casfs_module(name: str) -> str:
    """The casfs module an imported name lives in (a package's __init__ for a name in it)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


GRAPH = {
    mod: {casfs_module(n) for n in imported(path) if n == "casfs" or n.startswith("casfs.")} - {mod}
    for mod, path in MODULES.items()
}
THIRD_PARTY = {mod: {n.split(".")[0] for n in imported(path)} for mod, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def in_package(mod: str, *packages: str) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in packages)


def test_no_import_cycles() -> None:
    assert cycles(GRAPH) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    """The check itself can fail: a reintroduced arrow back up is caught."""
    graph = {k: set(v) for k, v in GRAPH.items()}
    graph["casfs.store.local"].add("casfs.repo")
    assert any("casfs.store.local" in c and "casfs.repo" in c for c in cycles(graph))


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("casfs.ids", ()),
        ("casfs.kinds", ()),
        ("casfs.sqlitewal", ()),
        ("casfs.store", ("casfs.errors", "casfs.sqlitewal", "casfs.store")),
        ("casfs.snapshots", ("casfs.errors", "casfs.ids", "casfs.kinds", "casfs.store", "casfs.snapshots")),
        (
            "casfs.catalog",
            (
                "casfs.errors",
                "casfs.ids",
                "casfs.kinds",
                "casfs.sqlitewal",
                "casfs.store.ids",
                "casfs.catalog",
            ),
        ),
    ],
)
def test_low_layers_import_only_below(package: str, allowed: tuple[str, ...]) -> None:
    wrong = {
        (mod, dep)
        for mod, deps in GRAPH.items()
        if in_package(mod, package)
        for dep in deps
        if not in_package(dep, *allowed) and dep != "casfs"
    }
    assert wrong == set()


def test_vfs_knows_nothing_above_it() -> None:
    above = ("casfs.fuse", "casfs.volumes", "casfs.images", "casfs.cli")
    vfs = {m: deps for m, deps in GRAPH.items() if in_package(m, "casfs.vfs")}
    wrong = {(m, d) for m, deps in vfs.items() for d in deps if in_package(d, *above)}
    assert wrong == set()


def test_only_the_fuse_layer_imports_pyfuse3_and_trio_stays_below_the_mount() -> None:
    assert {m for m, deps in THIRD_PARTY.items() if "pyfuse3" in deps} <= {
        m for m in MODULES if in_package(m, "casfs.fuse")
    }
    assert {m for m, deps in THIRD_PARTY.items() if "trio" in deps} <= {
        m for m in MODULES if in_package(m, "casfs.fuse", "casfs.vfs")
    }


def test_only_the_csi_plugin_imports_grpc() -> None:
    assert {m for m, deps in THIRD_PARTY.items() if deps & {"grpc", "google"}} <= {
        m for m in MODULES if in_package(m, "casfs.csi")
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["volume", "create", "c", "--from", "v@1"],
        ["snapshot", "create", "c"],
        ["volume", "ls"],
        ["gc"],
    ],
)
def test_commands_that_do_not_mount_import_neither_trio_pyfuse3_nor_grpc(
    store: Path, argv: list[str]
) -> None:
    """(Orchestrators call the CLI per volume: importing the mount's libraries costs
    each call tens of milliseconds.)"""
    setup = [["volume", "create", "v", "--blank-dir"], ["snapshot", "create", "v"]]
    probe = (
        "import sys; sys.argv = ['casfs', '-s', sys.argv[1], *sys.argv[2:]]\n"
        + RUN_IN_PROBE
        + "print('loaded:', sorted(m for m in ('trio', 'pyfuse3', 'grpc') if m in sys.modules))\n"
    )
    for step in setup:
        ok(store, *step)
    done = subprocess.run(
        [sys.executable, "-c", probe, str(store), *argv], capture_output=True, text=True, timeout=60
    )
    assert "loaded: []" in done.stdout, (done.stdout, done.stderr)
