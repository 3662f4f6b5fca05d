"""Check megaphone's layering: no import cycle between its modules, the packages' direction of
dependence, the order of the rooms inside ``migrator/``, and the size of modules and rooms.

Inside ``megaphone/migrator/`` the subpackages ("rooms") say where their code runs and stand in
an order, lowest first (:data:`ROOMS`): ``statedir`` (the driver's files), ``task`` (what runs
in a Spark task), ``epoch`` (the driver side of an epoch), ``control`` (planning inputs,
offline, autoscale), ``pipeline`` (the public facade, streaming, Connect). A room may import
itself and the rooms below it, never one above it (typing-only imports included); a module
directly under ``migrator/`` is the ground floor and imports no room. A room holds at most
:data:`MAX_ROOM_MODULES` modules.

Size is a guideline, not a rule for its own sake: a module should stay within
:data:`MAX_LINES` lines, and may exceed it (up to :data:`HARD_MAX_LINES`) only when it is
listed in :data:`ONE_IDEA` with the one idea that keeps it whole. Splitting such a module by
size would spread one idea over files that call each other both ways.

Imports are read with ``ast`` from every ``.py`` file under ``megaphone/``, at module level and
inside functions alike (a function-level import is still a dependency). Imports under
``if TYPE_CHECKING:`` carry no runtime dependency, so they do not count for cycles; they do
count for the package rules (``plans`` must not even name ``migrator`` for typing).

Usage: ``python3 .ci/check_layers.py [ROOT]`` (ROOT defaults to the repository); it prints each
problem and exits 1 if there is one.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "megaphone"
#: A module's size guideline (lines).
MAX_LINES = 400
#: No module may exceed this, listed in :data:`ONE_IDEA` or not.
HARD_MAX_LINES = 600
#: Modules that may exceed :data:`MAX_LINES`, relative to the repository, and their one idea.
ONE_IDEA: dict[str, str] = {
    "megaphone/migrator/pipeline/facade.py":
        "the public Pipeline: one documented, delegating member per public operation",
    "megaphone/state_backends/rocksdb.py":
        "the RocksDB backend: one class whose every write path keeps the bin counters and the "
        "bins written ahead exact with the data",
    "megaphone/state_backends/service.py":
        "the store service: one request loop and the operations it runs on open stores, which "
        "share their entries, leases and locks",
}
#: The rooms of ``megaphone/migrator/``, lowest first: each imports only itself and lower ones.
ROOMS = ("statedir", "task", "epoch", "control", "pipeline")
#: The most modules a room of ``migrator/`` holds (``__init__`` not counted).
MAX_ROOM_MODULES = 12

# A package (first component under megaphone/) may not import these, at any level.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "routing": ("plans", "migrator", "state_backends"),
    "plans": ("migrator", "state_backends"),
    "state_backends": ("migrator", "plans"),
    "operators": ("migrator", "plans", "state_backends", "nexmark"),
    "snailtrail": ("migrator", "plans", "state_backends", "operators", "nexmark"),
}


@dataclass
class Imports:
    """The megaphone modules one file imports: at run time, and for type checking only."""

    runtime: set[str] = field(default_factory=set)
    typing_only: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)


def module_name(root: Path, path: Path) -> str:
    """``megaphone/plans/plan.py`` -> ``megaphone.plans.plan``; a package's ``__init__`` is the
    package itself."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest known module that ``name`` (a dotted import target) names or lies in."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def read_imports(root: Path, path: Path, modules: set[str]) -> Imports:
    """The megaphone modules ``path`` imports, resolved to files of the tree."""
    me = module_name(root, path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = Imports()

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
            named = targets
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import mod`` imports the module ``pkg.mod`` when there is one
            targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
            named = [base]
        else:
            named = []
        found.missing.update(n for n in named if n.split(".")[0] == PACKAGE and n not in modules)
        for target in targets:
            if target.split(".")[0] != PACKAGE:
                continue
            resolved = _resolve(target, modules)
            if resolved and resolved != me:
                (found.typing_only if typing_only else found.runtime).add(resolved)
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def _layer(module: str, packages: set[str]) -> str | None:
    """The package under megaphone/ that ``module`` belongs to (None: a top-level module)."""
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in packages else None


def _room(module: str) -> int | None:
    """The floor of ``module`` inside ``megaphone.migrator``: 1 + the index of its room in
    :data:`ROOMS`, 0 for a module directly under ``migrator/`` (or an unknown room: reported
    apart), ``None`` outside ``migrator/``."""
    parts = module.split(".")
    if parts[:2] != [PACKAGE, "migrator"] or len(parts) < 3:
        return None
    return ROOMS.index(parts[2]) + 1 if parts[2] in ROOMS else 0


def room_problems(root: Path, files: list[Path], modules: set[str],
                  imports: dict[str, set[str]]) -> list[str]:
    """The rooms of ``migrator/``: unknown subpackages, too many modules in one, and imports
    from a lower room to a higher one (``imports``: every import of each module)."""
    out: list[str] = []
    migrator = root / PACKAGE / "migrator"
    if not migrator.is_dir():
        return out
    for sub in sorted(p for p in migrator.iterdir() if (p / "__init__.py").is_file()):
        if sub.name not in ROOMS:
            out.append(f"room: migrator/{sub.name} is not one of the rooms {ROOMS}")
        count = len([f for f in files if f.parent == sub and f.name != "__init__.py"])
        if count > MAX_ROOM_MODULES:
            out.append(f"room: migrator/{sub.name} has {count} modules "
                       f"(at most {MAX_ROOM_MODULES})")
    for me in sorted(imports):
        mine = _room(me)
        if mine is None:
            continue
        for target in sorted(imports[me]):
            theirs = _room(target)
            if theirs is not None and theirs > mine and not target.endswith(".migrator"):
                out.append(f"room: {me} imports {target} (a lower room may not import a "
                           "higher one)")
    return out


def problems(root: Path) -> list[str]:
    """Every layering problem of the tree at ``root``, as lines to print (empty: all good)."""
    files = sorted((root / PACKAGE).rglob("*.py"))
    modules = {module_name(root, f) for f in files}
    packages = {f.parent.name for f in files
                if f.name == "__init__.py" and f.parent != root / PACKAGE}
    out: list[str] = []
    graph: dict[str, set[str]] = {}
    every: dict[str, set[str]] = {}
    for f in files:
        me = module_name(root, f)
        imports = read_imports(root, f, modules)
        graph[me] = imports.runtime
        every[me] = imports.runtime | imports.typing_only
        out.extend(f"missing: {me} imports {name}, which is not a module of the tree"
                   for name in sorted(imports.missing))
        layer = _layer(me, packages)
        for target in sorted(imports.runtime | imports.typing_only):
            if layer in FORBIDDEN and _layer(target, packages) in FORBIDDEN[layer]:
                out.append(f"layer: {me} imports {target} ({layer}/ may not import "
                           f"{_layer(target, packages)}/)")
        lines = len(f.read_text().splitlines())
        where = f.relative_to(root).as_posix()
        limit = HARD_MAX_LINES if where in ONE_IDEA else MAX_LINES
        if lines > limit:
            out.append(f"size: {where} has {lines} lines (limit {limit})")
    out.extend(room_problems(root, files, modules, every))
    for component in cycles(graph):
        edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a]) if b in component]
        out.append("cycle: " + ", ".join(component) + " (" + "; ".join(edges) + ")")
    return out


def main(argv: list[str]) -> int:
    """Print the problems of the tree (default: this repository); 1 if there are any."""
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    found = problems(root)
    for line in found:
        print(line)
    print(f"check_layers: {len(found)} problem(s) in {root / PACKAGE}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
