"""The import rules, checked on the source: every `import` of casfs/ (at module level or
inside a function; `if TYPE_CHECKING:` blocks aside, as they never run) must point down.
The lazy faces count as the imports they make when used: `from casfs.volumes import X`
imports X's module (casfs.volumes' table of them), and each `_Module("casfs.cli.M")`
row of the CLI grammar imports M.

    every package has a floor (FLOORS); no arrow between packages goes up a floor
    no cycles among casfs's modules, nor among its packages
    casfs.ids, casfs.kinds  (the numbers and kinds every layer names) import nothing of casfs
    casfs.sqlitewal  (opening a SQLite file, for the store and the catalog) neither
    casfs.store      imports only casfs.errors, casfs.sqlitewal and casfs.store
    casfs.snapshots  imports only casfs.errors, casfs.ids, casfs.kinds, casfs.store and casfs.snapshots
    casfs.catalog    imports only casfs.errors, casfs.ids, casfs.kinds, casfs.sqlitewal, casfs.store (ids)
                     and casfs.catalog
    casfs.vfs        never imports casfs.fuse, casfs.volumes, casfs.images or casfs.cli
    only casfs.fuse imports pyfuse3; trio only casfs.fuse and, in casfs.vfs, its chunk cache;
                     grpc and protobuf only casfs.csi, casfs.snapshotter and casfs.grpcsvc
    only casfs.catalog, the pack index (and casfs.sqlitewal, which opens SQLite files) run SQL
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


def _lazy_names(package: str) -> dict[str, str]:
    """A lazy face's table (PEP 562 `__getattr__` over `_MODULES = {module: names}`):
    name -> the module it is imported from."""
    tree = ast.parse(MODULES[package].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_MODULES" for t in node.targets):
            table = ast.literal_eval(node.value)
            return {name: f"{package}.{module}" for module, names in table.items() for name in names}
    return {}


LAZY = {"casfs.volumes": _lazy_names("casfs.volumes")}


def imported(path: Path) -> Iterator[str]:
    """Every module name an import in the file names (a `from m import x` names m.x when
    that is a module of casfs, or x's module when m is a lazy face, else m), and the
    modules the CLI grammar's rows name."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                lazy = LAZY.get(node.module, {}).get(alias.name)
                yield full if full in MODULES else lazy or node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_Module" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield arg.value


def casfs_module(name: str) -> str:
    """The casfs module an imported name lives in (a package's __init__ for a name in it)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


GRAPH = {
    mod: {casfs_module(n) for n in imported(path) if n == "casfs" or n.startswith("casfs.")} - {mod}
    for mod, path in MODULES.items()
}
for face, names in LAZY.items():
    GRAPH[face] |= set(names.values())  # (any attribute of the face may import its module)

# Each package's floor: a module imports only from its own package and from packages
# on its floor or below (docs/developer-notes.md, "Where things are").
FLOORS = {
    "errors": 0, "ids": 0, "kinds": 0, "units": 0, "sqlitewal": 0, "store": 0,
    "catalog": 1, "snapshots": 1, "lifecycle": 1,
    "refcount": 2, "repo": 2,
    "vfs": 3, "importers": 3, "exporters": 3,
    "volumes": 4, "images": 4,
    "metrics": 4,
    "replica": 5, "fuse": 5, "upkeep": 5,
    "grpcsvc": 5,
    "cli": 6, "csi": 6, "snapshotter": 6, "__main__": 6, "casfs": 6,
}  # fmt: skip


def package(mod: str) -> str:
    """casfs.store.local -> store; casfs -> casfs (the root's __init__)."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The arrows between packages that go up a floor."""
    return {
        (mod, dep)
        for mod, deps in graph.items()
        for dep in deps
        if package(mod) != package(dep) and FLOORS[package(dep)] > FLOORS[package(mod)]
    }


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {package(m): set() for m in graph}
    for mod, deps in graph.items():
        packages[package(mod)] |= {package(d) for d in deps} - {package(mod)}
    return packages


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


def test_every_package_has_a_floor() -> None:
    assert {package(m) for m in MODULES} <= set(FLOORS)


def test_no_arrow_between_packages_goes_up() -> None:
    assert upward(GRAPH) == set()


def test_no_package_cycles() -> None:
    assert cycles(package_graph(GRAPH)) == []


def test_the_floor_check_finds_an_arrow_going_up() -> None:
    """The loop the review found, put back: a volume's creation running recovery."""
    graph = {k: set(v) for k, v in GRAPH.items()}
    graph["casfs.volumes.create"].add("casfs.upkeep.recovery")
    assert ("casfs.volumes.create", "casfs.upkeep.recovery") in upward(graph)
    assert any({"upkeep", "volumes"} <= set(c) for c in cycles(package_graph(graph)))


def test_the_lazy_faces_are_seen_through() -> None:
    """`from casfs.volumes import finish_delete` is an arrow to volumes.create, and a
    grammar row an arrow to its command's module: a loop through either is a cycle."""
    assert "casfs.volumes.create" in GRAPH["casfs.upkeep.recovery"]
    assert "casfs.cli.volumes" in GRAPH["casfs.cli.grammar"]
    graph = {k: set(v) for k, v in GRAPH.items()}
    graph["casfs.volumes.create"].add("casfs.upkeep.recovery")
    assert any("casfs.volumes.create" in c and "casfs.upkeep.recovery" in c for c in cycles(graph))


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
        m for m in MODULES if in_package(m, "casfs.fuse")
    } | {"casfs.vfs.chunks"}


_SQL = {"execute", "executemany", "executescript"}
SQL_ALLOWED = ("casfs.catalog", "casfs.store.packindex", "casfs.sqlitewal")


def runs_sql(path: Path) -> bool:
    """Whether the module calls a SQLite connection's or cursor's execute*."""
    tree = ast.parse(path.read_text())
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _SQL
        for n in ast.walk(tree)
    )


def test_only_the_catalog_and_the_pack_index_run_sql() -> None:
    assert {m for m, path in MODULES.items() if runs_sql(path) and not in_package(m, *SQL_ALLOWED)} == set()


def test_only_the_grpc_services_import_grpc() -> None:
    assert {m for m, deps in THIRD_PARTY.items() if deps & {"grpc", "google"}} <= {
        m for m in MODULES if in_package(m, "casfs.csi", "casfs.snapshotter", "casfs.grpcsvc")
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
