"""Check that every module megaphone, its tests and its benchmarks import is declared.

A top-level import must be the standard library, the project itself (``megaphone``, or a
module of ``tests/`` or ``bench/``), or provided by a distribution that ``pyproject.toml``
declares -- in ``dependencies`` or an optional extra -- or that one of those requires (their
own requirements are followed as installed, extras only where they were asked for). Anything
else works only on a machine where it happens to be installed: on a fresh one it fails, as
``import cloudpickle`` in a test once did (PySpark bundles it as ``pyspark.cloudpickle``).

Run it in the project's own environment (CI's fresh virtual environment), from anywhere:
``python3 .ci/check_imports.py [ROOT]``. It prints each undeclared import with where it occurs
and exits 1 if there is one.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import tomllib

SOURCES = ("megaphone", "tests", "bench")


def canonical(name: str) -> str:
    """A distribution's name as the packaging standards compare it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(text: str) -> tuple[str, set[str], str]:
    """``"pyspark[connect]>=4.1; python_version>'3'"`` -> ``("pyspark", {"connect"}, marker)``."""
    spec, _, marker = text.partition(";")
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", spec)
    if match is None:
        raise ValueError(f"unreadable requirement {text!r}")
    extras = {canonical(e) for e in (match.group(2) or "").split(",") if e.strip()}
    return canonical(match.group(1)), extras, marker


def declared_distributions(root: Path) -> set[str]:
    """The distributions pyproject.toml declares (all extras) and everything they require."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    wanted = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        wanted += extra
    todo = [parse_requirement(r)[:2] for r in wanted]
    seen: dict[str, set[str]] = {}
    while todo:
        name, extras = todo.pop()
        if name in seen and extras <= seen[name]:
            continue
        seen[name] = seen.get(name, set()) | extras
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # declared but not installed: pip would have failed already
        for requirement in requires:
            child, child_extras, marker = parse_requirement(requirement)
            asked = re.findall(r"""extra\s*==\s*["']([^"']+)["']""", marker)
            if asked and not {canonical(a) for a in asked} & seen[name]:
                continue  # a requirement of an extra nobody asked for
            todo.append((child, child_extras))
    return set(seen)


def local_modules(root: Path) -> set[str]:
    """Top-level names that resolve to the project's own files (tests and benchmarks import
    their helpers by bare name)."""
    names = set(SOURCES)
    for folder in SOURCES[1:]:
        for path in (root / folder).rglob("*.py"):
            names.add(path.stem)
            names.update(p.name for p in path.relative_to(root / folder).parents if p.name)
    return names


def top_level_imports(path: Path) -> list[tuple[str, int]]:
    """Each absolute import's first component in ``path``, with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno))
    return found


def undeclared(root: Path) -> dict[str, list[str]]:
    """Import name -> where it occurs, for every import no declared distribution provides."""
    declared = declared_distributions(root)
    providers = {name: {canonical(d) for d in dists}
                 for name, dists in metadata.packages_distributions().items()}
    local = local_modules(root)
    missing: dict[str, list[str]] = {}
    for folder in SOURCES:
        for path in sorted((root / folder).rglob("*.py")):
            for name, line in top_level_imports(path):
                if name in sys.stdlib_module_names or name in local:
                    continue
                if not providers.get(name, set()) & declared:
                    missing.setdefault(name, []).append(f"{path.relative_to(root)}:{line}")
    return missing


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    missing = undeclared(root)
    for name, where in sorted(missing.items()):
        shown = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
        print(f"undeclared import {name!r}: no dependency in pyproject.toml provides it "
              f"({shown})")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
