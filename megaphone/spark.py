"""One place that builds the SparkSession megaphone runs on (embedded, a cluster, or Spark
Connect), and what megaphone asks of any session without reaching into the JVM."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from megaphone._version import __version__
from megaphone.errors import MegaphoneError

#: Settings megaphone relies on: Python workers use the driver's interpreter (unless the user
#: names another, see :func:`spark_session`), Arrow is on, and adaptive execution may not merge
#: the per-worker partitions of an epoch.
SESSION_CONF: dict[str, str] = {
    "spark.pyspark.python": sys.executable,
    "spark.pyspark.driver.python": sys.executable,
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}
#: The settings of :data:`SESSION_CONF` a Spark Connect client may set (per session).
RUNTIME_CONF = ("spark.sql.execution.arrow.pyspark.enabled",
                "spark.sql.adaptive.coalescePartitions.enabled", "spark.sql.shuffle.partitions",
                "spark.sql.session.timeZone")

#: Spark's optimizer rule that computes a projection over local data (a DataFrame made from
#: Python or Arrow data) row by row in the interpreter, before constants are folded: it would
#: rebuild the routing version's owner array
#: (:func:`~megaphone.routing.bins.owner_column`) for every record -- ~7 s for an
#: epoch of 20,000 records at 4,096 bins instead of ~0.3 s.
LOCAL_RELATION_RULE = "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation"

log = logging.getLogger("megaphone.spark")


def apply_pipeline_settings(spark: SparkSession) -> None:
    """Set what every pipeline needs on its session, whoever built it: adaptive execution may
    not merge partitions (partition ``w`` is worker ``w``), and :data:`LOCAL_RELATION_RULE` is
    off (added to any rules the session already excludes)."""
    spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
    excluded = [r.strip() for r in (spark.conf.get("spark.sql.optimizer.excludedRules", None)
                                    or "").split(",") if r.strip()]
    if LOCAL_RELATION_RULE not in excluded:
        spark.conf.set("spark.sql.optimizer.excludedRules",
                       ",".join([*excluded, LOCAL_RELATION_RULE]))


#: Spark's switch for adaptive query execution, off while an epoch's job runs
#: (:func:`adaptive_off`).
ADAPTIVE = "spark.sql.adaptive.enabled"
#: Spark's cap on the bytes of one Arrow batch it sends to Python. Unless it is ``Int.MaxValue``,
#: Spark checks it after every row by sizing every column of the batch: in Spark 4.1 more than
#: half of the JVM's CPU in a NEXMark Q7 window task (docs/operators.md, "Arrow batches cut by
#: rows"). :func:`byte_cap_unchecked` skips the check where it cannot bind.
ARROW_MAX_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
#: Spark's cap on the rows of one Arrow batch it sends to Python (``<= 0``: none).
ARROW_MAX_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: :data:`ARROW_MAX_BYTES`'s default (64 MiB) and the value at which Spark skips its check.
ARROW_DEFAULT_BYTES, ARROW_UNCHECKED_BYTES = 64 << 20, 2**31 - 1
_jobs_lock = threading.Lock()
#: (id(session), setting): [the session's own value, each value a job inside wants (``None``:
#: the session's own)].
_jobs_inside: dict[tuple[int, str], list[Any]] = {}


@contextlib.contextmanager
def _while_jobs_run(spark: SparkSession, name: str,
                    wants: Callable[[str | None], str | None]) -> Iterator[None]:
    """Run the Spark jobs inside with setting ``name`` at ``wants(own)`` (``own``: the
    session's value before the first job inside, ``None`` if unset; ``wants`` returns ``None``
    for ``own``), restored once the last job inside, on any thread, is done. While jobs inside
    want different values, the session has its own (a job reads its settings when it starts)."""
    key = (id(spark), name)
    with _jobs_lock:
        entry = _jobs_inside.get(key)
        if entry is None:
            entry = _jobs_inside[key] = [spark.conf.get(name, None), []]
        want = wants(entry[0])
        entry[1].append(want)
        _apply_setting(spark, name, entry)
    try:
        yield
    finally:
        with _jobs_lock:
            entry[1].remove(want)
            _apply_setting(spark, name, entry)
            if not entry[1]:
                del _jobs_inside[key]


def _apply_setting(spark: SparkSession, name: str, entry: list[Any]) -> None:
    """Setting ``name`` for the jobs inside :func:`_while_jobs_run` (``entry`` as kept there):
    the one value they all want, else the session's own."""
    own, wanted = entry
    value = wanted[0] if wanted and len(set(wanted)) == 1 and wanted[0] is not None else own
    if value is None:
        spark.conf.unset(name)
    else:
        spark.conf.set(name, value)


def adaptive_off(spark: SparkSession) -> contextlib.AbstractContextManager[None]:
    """Plan and run the Spark jobs inside without adaptive query execution, then restore the
    session's setting (once the last of the jobs inside, on any thread, is done). An epoch's job
    gains nothing from it (its partitions are its workers, never merged; it joins nothing) and
    pays for it: adaptive execution runs a job a shuffle stage at a time, re-planning between
    them, about 80 ms of a NEXMark Q7 epoch of 0.8 s (docs/operators.md, "A chain's epoch in
    one job"). Other queries of the session planned meanwhile plan without it too: the same
    results, planned as Spark did before 3.2."""
    return _while_jobs_run(spark, ADAPTIVE, lambda own: "false")


def byte_cap_unchecked(spark: SparkSession, row_bytes: int | None
                       ) -> contextlib.AbstractContextManager[None]:
    """Run the Spark jobs inside without Spark's row-by-row check of :data:`ARROW_MAX_BYTES`
    where the cap cannot bind: the session leaves it at its default and a batch of the most
    rows Spark puts in one (:data:`ARROW_MAX_RECORDS`) of at most ``row_bytes`` each fits under
    it. ``row_bytes`` is ``None`` when a row has no such bound (a string, state, a partial
    aggregate): the check stays. Batches then hold exactly the rows they would have held.

    The setting is the session's, restored once the last job inside on any thread is done;
    while any job inside keeps the check, the session has it (a job reads it when it starts)."""
    records = int(spark.conf.get(ARROW_MAX_RECORDS, "10000"))

    def wants(own: str | None) -> str | None:
        bounded = row_bytes is not None and records > 0 and \
            records * row_bytes <= ARROW_DEFAULT_BYTES
        return str(ARROW_UNCHECKED_BYTES) if own is None and bounded else None

    return _while_jobs_run(spark, ARROW_MAX_BYTES, wants)


def spark_session(
    master: str = "local[*]", app_name: str = "megaphone", conf: dict[str, str] | None = None
) -> SparkSession:
    """Return a SparkSession with megaphone's settings; ``master`` may name any cluster, or a
    Spark Connect server (``sc://host:port``: only the per-session settings are applied).

    Python workers run on the interpreter the user chose -- ``spark.pyspark.python`` in
    ``conf``, else the ``PYSPARK_PYTHON`` environment variable -- and otherwise on this
    driver's own (``sys.executable``), not on whatever ``python3`` is first on ``PATH``: a
    SparkContext started from Python takes its workers' interpreter from ``PYSPARK_PYTHON``
    alone, so that variable is set for the process when no SparkContext runs yet.
    """
    if master.startswith("sc://"):
        session = SparkSession.builder.remote(master).getOrCreate()
        for key, value in {**{k: SESSION_CONF[k] for k in RUNTIME_CONF}, **(conf or {})}.items():
            session.conf.set(key, value)
        return session
    # Embedded Spark binds to loopback: no traffic leaves the machine, no hostname warning.
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = {**SESSION_CONF, **(conf or {})}
    if SparkContext._active_spark_context is None:
        python = (conf or {}).get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
        settings["spark.pyspark.python"] = os.environ["PYSPARK_PYTHON"] = python or sys.executable
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client session (no SparkContext, no local JVM)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


#: A local master with its thread count (``local[N]``, ``local[N,F]``, ``local[*]``).
_LOCAL_MASTER = re.compile(r"local\[(\d+|\*)(?:,\d+)?\]")


def _server_conf(spark: SparkSession, name: str) -> str | None:
    """A setting of the Spark Connect server, ``None`` where it is unset or not exposed."""
    try:
        return spark.conf.get(name, None)
    except Exception:  # a setting the server does not expose
        return None


def task_slots(spark: SparkSession) -> int:
    """How many tasks the cluster runs at once (Spark's default parallelism).

    A Spark Connect client cannot ask the SparkContext, so it reads the server's settings:
    ``spark.default.parallelism``, else ``local[N]``, else executors times cores; failing all,
    2 (Spark's own floor), said in the log.
    """
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    if (value := _server_conf(spark, "spark.default.parallelism")) and value.isdigit():
        return int(value)
    master = _server_conf(spark, "spark.master") or ""
    if m := _LOCAL_MASTER.fullmatch(master):
        return (os.cpu_count() or 2) if m.group(1) == "*" else int(m.group(1))
    instances = _server_conf(spark, "spark.executor.instances")
    cores = _server_conf(spark, "spark.executor.cores")
    if instances and cores and instances.isdigit() and cores.isdigit():
        return int(instances) * int(cores)
    log.info("task slots of the Spark Connect server unknown (master %r); assuming 2: set "
             "spark.default.parallelism to tell", master)
    return 2


def local_slots(spark: SparkSession) -> int | None:
    """The task slots of a local master (``local``, ``local[N]``, ``local[N,F]``,
    ``local[*]``), all on the driver's one host; ``None`` for a cluster master (``local-cluster``
    too), whose slots per host Python cannot tell apart (docs/placement.md)."""
    master = (_server_conf(spark, "spark.master") or "") if is_connect(spark) else \
        spark.sparkContext.master
    if master == "local" or _LOCAL_MASTER.fullmatch(master):
        return task_slots(spark)
    return None


class WorkerPythonError(MegaphoneError, RuntimeError):
    """Spark's Python workers cannot run megaphone: another Python version, megaphone missing
    or of another version there. Raised before a pipeline's first epoch changes anything."""


# The probe runs in Spark's Python workers, where megaphone may be missing: it is compiled here
# into a module of its own that no worker can import, so cloudpickle ships it by value.
_PROBE_SOURCE = '''
def probe(_):
    import sys
    try:
        import megaphone
        found = "megaphone " + megaphone.__version__
    except BaseException as error:
        lines = str(error).strip().splitlines()
        found = "no megaphone (" + type(error).__name__ + (": " + lines[0] if lines else "") + ")"
    return "%s|%d.%d.%d|%s" % ((sys.executable,) + tuple(sys.version_info[:3]) + (found,))
'''
#: Sessions (Connect) and SparkContexts (classic) whose workers passed the check: asked at
#: every epoch, so the test is a lookup, not a call into the JVM.
_checked: weakref.WeakSet[Any] = weakref.WeakSet()


def _probe_function() -> Any:
    namespace: dict[str, Any] = {"__name__": "_megaphone_worker_probe"}
    exec(compile(_PROBE_SOURCE, "<megaphone worker probe>", "exec"), namespace)
    return namespace["probe"]


def _failure_reason(error: BaseException) -> str:
    """The one line of a failed probe job that says why: a version mismatch, or the last
    Python error the worker printed."""
    text = str(error)
    if m := re.search(r"different version:?\s*(\d+\.\d+)\s+than that in driver:?\s*(\d+\.\d+)",
                      text):
        return f"which runs Python {m.group(1)} where the driver runs {m.group(2)}"
    found = re.findall(r"^\s*((?:\w+\.)*\w+(?:Error|Exception): .+)$", text, re.M)
    line = found[-1] if found else (text.strip().splitlines() or ["unknown error"])[0]
    return f"which failed: {line.strip()[:300]}"


def check_python_workers(spark: SparkSession) -> None:
    """Fail with one clear line, once per Spark application, when its Python workers cannot
    run megaphone: what interpreter the driver and the workers run, which Python version, and
    whether megaphone imports there -- instead of a Spark stack trace from inside a task.

    A tiny job probes as many tasks as the cluster runs at once. Raises
    :class:`WorkerPythonError`.
    """
    key = spark if is_connect(spark) else spark.sparkContext
    if key in _checked:
        return
    driver = (f"driver {sys.executable} (Python {'.'.join(map(str, sys.version_info[:3]))}, "
              f"megaphone {__version__})")
    workers = ("workers: the Connect server's PYSPARK_PYTHON" if is_connect(spark)
               else f"workers: {spark.sparkContext.pythonExec}")
    advice = (f"set PYSPARK_PYTHON (or spark.pyspark.python) to a Python "
              f"{sys.version_info[0]}.{sys.version_info[1]} with megaphone {__version__} "
              f"installed, on every worker host")
    slots = max(1, task_slots(spark))
    probe = F.udf(_probe_function(), "string")
    try:
        # One stage, one row per slot (distinct() would add a shuffle to every app's start).
        rows = spark.range(0, slots, 1, slots).select(probe("id").alias("p")).collect()
    except Exception as error:
        raise WorkerPythonError(f"Spark's Python workers cannot run megaphone: {driver}; "
                                f"{workers}, {_failure_reason(error)}; {advice}") from None
    bad = []
    for probed in {row["p"] for row in rows}:
        executable, version, found = probed.split("|", 2)
        if found != f"megaphone {__version__}":
            bad.append(f"{executable} (Python {version}), {found}")
    if bad:
        raise WorkerPythonError(f"Spark's Python workers cannot run megaphone: {driver}; "
                                f"{workers}, running {'; '.join(sorted(bad))}; {advice}")
    _checked.add(key)


def empty_frame(spark: SparkSession, schema: T.StructType) -> DataFrame:
    """An empty DataFrame of ``schema`` that Spark plans as an empty local relation, so that
    acting on it runs no Spark job: one made from an empty list is an RDD's, and collecting it
    runs a job each time (0.25-0.3 s against 0.05 s here, on two cores). Made as one row of
    nulls filtered out; a schema with a field that cannot be null gets the RDD's."""
    if all(f.nullable for f in schema.fields):
        frame = spark.createDataFrame([tuple(None for _ in schema.fields)], schema)
        if frame.schema == schema:
            return frame.where(F.lit(False))
    return spark.createDataFrame([], schema)


_NO_ROWS: weakref.WeakKeyDictionary[SparkSession, dict[str, DataFrame]] = \
    weakref.WeakKeyDictionary()


def no_rows(spark: SparkSession, schema: T.StructType) -> DataFrame:
    """A DataFrame of ``schema`` without rows that Spark cannot prove empty, made once per
    session and schema: an RDD's without partitions, or over Spark Connect (no RDDs) an empty
    range of one partition. In the epoch's shuffle it keeps Spark's optimizer from removing
    the shuffle and the workers' tasks with it when the batch is an empty local relation
    (``limit(0)``, a local table filtered to nothing): every worker runs every epoch, records
    or not, or its store would fall behind."""
    frames = _NO_ROWS.setdefault(spark, {})
    key = schema.json()
    if key not in frames:
        frames[key] = spark.range(0, 0, 1, 1).select(
            *[F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields]) \
            if is_connect(spark) else spark.createDataFrame(spark.sparkContext.emptyRDD(), schema)
    return frames[key]
