"""Spark's Python workers run megaphone's own interpreter by default, and a session whose
workers cannot run megaphone fails its first epoch with one clear line, changing nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DRIVER = Path(__file__).parent / "helpers" / "worker_python_driver.py"


def other_python() -> str:
    """An interpreter of another minor version than this one, if the machine has one."""
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for version in ("3.13", "3.12", "3.11", "3.10"):
        if version == mine:
            continue
        found = [shutil.which(f"python{version}"),
                 *sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))]
        for path in filter(None, found):
            if subprocess.run([str(path), "-c", "pass"], capture_output=True).returncode == 0:
                return str(path)
    return ""


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("worker-python")
    # A worker interpreter on which `import megaphone` fails: this one, with a package of that
    # name first on its path.
    shadow = root / "shadow" / "megaphone"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('megaphone is not installed here')\n")
    wrapper = root / "python-without-megaphone"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{shadow.parent}:$PYTHONPATH" '
                       f'exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    # A `python3` first on PATH that is not this interpreter: workers must not pick it up.
    decoy = root / "bin"
    decoy.mkdir()
    (decoy / "python3").write_text("#!/bin/sh\necho 'decoy python3 was run' >&2\nexit 3\n")
    (decoy / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{decoy}:{os.environ['PATH']}"}
    env.pop("PYSPARK_PYTHON", None)
    # Run outside the checkout: a worker started there would find megaphone in its directory.
    done = subprocess.run([sys.executable, str(DRIVER), str(wrapper), other_python()], env=env,
                          cwd=root, capture_output=True, text=True, timeout=600)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and line, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(line[0][len("RESULT "):])


def test_workers_run_the_drivers_interpreter_not_python3_on_path(results):
    assert results["default"] == {"rows": 10, "epoch": 0, "python_exec": sys.executable}


def test_workers_without_megaphone_fail_the_first_epoch_in_one_line(results):
    shadowed = results["shadowed"]
    message = shadowed["error"]
    assert "\n" not in message
    assert message.startswith("Spark's Python workers cannot run megaphone: ")
    assert f"driver {sys.executable} (Python {sys.version.split()[0]}" in message
    assert "no megaphone (ImportError: megaphone is not installed here)" in message
    assert "PYSPARK_PYTHON" in message
    assert shadowed["epoch"] == -1  # nothing committed
    assert shadowed["python_exec"].endswith("python-without-megaphone")


def test_workers_of_another_python_version_fail_the_first_epoch_in_one_line(results):
    if "other_version" not in results:
        pytest.skip("this machine has no Python of another minor version")
    other = results["other_version"]
    message = other["error"]
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert "\n" not in message
    assert message.startswith("Spark's Python workers cannot run megaphone: ")
    assert f"where the driver runs {mine}" in message and "which runs Python 3." in message
    assert other["epoch"] == -1
