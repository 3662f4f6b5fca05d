"""The layering check of CI (``.ci/check_layers.py``): the tree passes it, and it catches what it
is meant to catch (cycles through function-level imports, a plans module naming the runtime,
an oversized module), on small trees built here."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_checker():
    spec = importlib.util.spec_from_file_location("check_layers", ROOT / ".ci" / "check_layers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check_layers = _load_checker()


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "megaphone" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for folder in {p.parent for p in (tmp_path / "megaphone").rglob("*.py")}:
        (folder / "__init__.py").touch()
    return tmp_path


def test_megaphone_has_no_layering_problem():
    assert check_layers.problems(ROOT) == []


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    root = _tree(tmp_path, {
        "migrator/a.py": "from megaphone.migrator.b import g\n",
        "migrator/b.py": "def g():\n    from megaphone.migrator import a\n    return a\n",
    })
    found = check_layers.problems(root)
    assert len(found) == 1
    assert found[0].startswith("cycle: megaphone.migrator.a, megaphone.migrator.b")


def test_relative_imports_are_resolved(tmp_path):
    root = _tree(tmp_path, {
        "migrator/a.py": "from .b import g\n",
        "migrator/b.py": "from . import a\n",
    })
    assert [p.split(" (")[0] for p in check_layers.problems(root)] == [
        "cycle: megaphone.migrator.a, megaphone.migrator.b"]


def test_type_checking_imports_make_no_cycle_but_break_the_package_rule(tmp_path):
    root = _tree(tmp_path, {
        "migrator/pipeline.py": "from megaphone.plans import rescale\n",
        "plans/rescale.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from megaphone.migrator.pipeline import Pipeline
            """,
    })
    assert check_layers.problems(root) == [
        "layer: megaphone.plans.rescale imports megaphone.migrator.pipeline "
        "(plans/ may not import migrator/)"]


@pytest.mark.parametrize("lines, bad", [(check_layers.MAX_LINES, False),
                                        (check_layers.MAX_LINES + 1, True)])
def test_the_size_limit(tmp_path, lines, bad):
    root = _tree(tmp_path, {"routing/big.py": "x = 1\n" * lines})
    assert bool(check_layers.problems(root)) is bad


def test_main_exits_1_on_a_problem(tmp_path, capsys):
    root = _tree(tmp_path, {"routing/t.py": "import megaphone.migrator.x\n",
                            "migrator/x.py": ""})
    assert check_layers.main(["check_layers", str(root)]) == 1
    assert "routing/ may not import migrator/" in capsys.readouterr().out


def test_an_import_of_a_module_that_is_gone_is_found(tmp_path):
    root = _tree(tmp_path, {
        "migrator/a.py": "def f():\n    from megaphone.migrator.gone import x\n"})
    assert check_layers.problems(root) == [
        "missing: megaphone.migrator.a imports megaphone.migrator.gone, which is not a module "
        "of the tree"]


def test_a_lower_room_of_the_migrator_may_not_import_a_higher_one(tmp_path):
    root = _tree(tmp_path, {
        "migrator/task/s.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from megaphone.migrator.pipeline.facade import Pipeline
            """,
        "migrator/pipeline/facade.py": "from megaphone.migrator.task import s\n",
        "migrator/kitchen/k.py": "",
    })
    assert check_layers.problems(root) == [
        "room: migrator/kitchen is not one of the rooms "
        "('statedir', 'task', 'epoch', 'control', 'pipeline')",
        "room: megaphone.migrator.task.s imports megaphone.migrator.pipeline.facade "
        "(a lower room may not import a higher one)"]


def test_a_module_over_the_guideline_needs_one_idea_and_stays_under_the_hard_cap(tmp_path):
    long = "x = 1\n" * (check_layers.MAX_LINES + 1)
    root = _tree(tmp_path, {"migrator/pipeline/facade.py": long, "routing/big.py": long})
    assert check_layers.problems(root) == [
        f"size: megaphone/routing/big.py has {check_layers.MAX_LINES + 1} lines "
        f"(limit {check_layers.MAX_LINES})"]
