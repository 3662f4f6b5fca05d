"""Shared fixtures: one embedded SparkSession for the whole test session."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, settings

# The store services this session starts live in a directory of its own: a test never reaches,
# or replaces, a service that the user's own pipelines run in $TMPDIR/megaphone-<uid>, and the
# session stops every service it started when it ends. Set before any SparkSession starts, so
# every executor and Python worker (and every subprocess a test starts) inherits it.
_LOCAL_DIR = tempfile.mkdtemp(prefix="megaphone-tests-")
os.environ["MEGAPHONE_LOCAL_DIR"] = _LOCAL_DIR

# The suite starts many short-lived JVMs (the session's, every crash test's restarts, the
# simulated hosts, the Spark Connect server) on 2 cores, where the optimizing JIT's compile
# threads and the parallel collector's threads take the CPU the start-up needs: C1 only and
# the serial collector halve a JVM's start and first job here (41 -> 23 s, measured). On top,
# the classes a Spark driver loads are archived once per session (AppCDS: one training run of
# a pipeline epoch, ~38 s) and every later JVM maps them instead of loading them again: a
# driver's start and first job 12 -> 5 s here. A JVM whose class path differs (spark-submit's
# launcher, a server) cannot use the archive and runs as before (the notice is silenced).
# Tests only (every JVM started from this environment inherits it); what megaphone runs on is
# untouched, and benchmarks never import this file.
_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_TRAIN = """
import tempfile
from megaphone import Pipeline
from megaphone.spark import spark_session
spark = spark_session("local[2]", "megaphone-tests-class-archive")
with tempfile.TemporaryDirectory() as d:
    pipe = Pipeline(spark, d, key="k", update="count", workers=2, num_bins=16, key_type="int64")
    pipe.process(spark.createDataFrame([(k,) for k in range(20)], "k long")).collect()
    pipe.close()
spark.stop()
"""


def _class_archive(directory: str) -> str:
    """The JVM options of the suite, with a class archive in ``directory`` trained in a
    subprocess when that works (without it otherwise: the archive only saves time)."""
    from megaphone.state_backends.service_client import service_pids

    archive = os.path.join(directory, "spark-classes.jsa")
    services = os.path.join(directory, "training")  # its store service's, not the tests'
    quiet = "-Xlog:cds*=off"
    env = {**os.environ, "MEGAPHONE_LOCAL_DIR": services, "JAVA_TOOL_OPTIONS":
           f"{_JVM_OPTIONS} -XX:ArchiveClassesAtExit={archive} {quiet}"}
    try:
        subprocess.run([sys.executable, "-c", _TRAIN], env=env, capture_output=True,
                       timeout=300, check=True)
    except (subprocess.SubprocessError, OSError):
        return _JVM_OPTIONS
    finally:
        for pid in service_pids(services):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    if not os.path.exists(archive):
        return _JVM_OPTIONS
    return f"{_JVM_OPTIONS} -XX:SharedArchiveFile={archive} {quiet}"


# Trained once per run: by pytest-xdist's controller, whose test processes (started after this)
# inherit the options; the process that trained it removes it at the end (pytest_unconfigure).
_ARCHIVE_DIR: str | None = None
if "JAVA_TOOL_OPTIONS" not in os.environ:  # the user's own settings win
    _ARCHIVE_DIR = tempfile.mkdtemp(prefix="megaphone-tests-jvm-")
    os.environ["JAVA_TOOL_OPTIONS"] = _class_archive(_ARCHIVE_DIR)


def pytest_unconfigure(config: pytest.Config) -> None:
    """At the end of this process's run, stop the store services it started (in its own
    directory) and remove that directory, and the class archive if this process made it."""
    from megaphone.state_backends.service_client import service_pids

    for pid in service_pids(_LOCAL_DIR):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(_LOCAL_DIR, ignore_errors=True)
    if _ARCHIVE_DIR is not None:
        shutil.rmtree(_ARCHIVE_DIR, ignore_errors=True)


#: Test files whose runs take longest (SIGKILL crash chains, simulated hosts, the long property
#: runs): every test in them is marked ``slow``. They stay part of the suite; ``-m "not slow"``
#: runs the rest in about a quarter of the time (CI's pass on a second Python version).
SLOW_FILES = frozenset({
    "test_recovery.py", "test_event_time_recovery.py", "test_groups_recovery.py",
    "test_equivalence.py", "test_cluster.py", "test_groups_stream.py", "test_checkpoint.py",
    "test_hot_split.py",
})
#: Files whose tests take longest together (crash chains, property runs against Spark, servers,
#: benchmarks' smoke runs), longest first (as measured): the suite's two test processes
#: (pytest-xdist, a file at a time each, so a module's fixtures start once) start them first,
#: and the short files fill the end, so that neither process finishes a long file alone.
LONGEST_FIRST = (
    "test_recovery.py", "test_event_time_recovery.py", "test_stateful_processor.py",
    "test_groups_recovery.py", "test_bench_smoke.py", "test_cluster.py", "test_equivalence.py",
    "test_groups_stream.py", "test_event_time.py", "test_pipeline.py", "test_chain_stream.py",
    "test_connect.py", "test_checkpoint.py", "test_update_errors.py", "test_worker_python.py",
    "test_nexmark_queries.py", "test_hot_split.py", "test_groups.py", "test_bench_nexmark.py",
    "test_bench_relief.py", "test_relief_pipeline.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of :data:`SLOW_FILES` ``slow``, and run those of
    :data:`LONGEST_FIRST` first, in its order."""
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("MEGAPHONE_HYPOTHESIS_MAX", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("ci")


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession every Spark test shares (local[2], small shuffles)."""
    from megaphone.spark import spark_session

    session = spark_session("local[2]", "megaphone-tests")
    yield session
    session.stop()


@pytest.fixture
def local(tmp_path):
    """A store service of this test's own (its local directory); stopped at the end."""
    from megaphone.state_backends.service_client import service_pid

    directory = str(tmp_path / "local")
    yield directory
    pid = service_pid(directory)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
