"""One place that builds the SparkSession megaphone runs on (embedded, a cluster, or Spark
Connect), and what megaphone asks of any session without reaching into the JVM."""

from __future__ import annotations

import logging
import os
import re
import sys

from pyspark.sql import SparkSession

#: Settings megaphone relies on: Python workers use this interpreter, Arrow is on, and
#: adaptive execution may not merge the per-worker partitions of an epoch.
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
#: rebuild the routing version's owner array (:func:`~megaphone.migrator.spark_job.owner_column`)
#: for every record -- ~7 s for an epoch of 20,000 records at 4,096 bins instead of ~0.3 s.
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


def spark_session(
    master: str = "local[*]", app_name: str = "megaphone", conf: dict[str, str] | None = None
) -> SparkSession:
    """Return a SparkSession with megaphone's settings; ``master`` may name any cluster, or a
    Spark Connect server (``sc://host:port``: only the per-session settings are applied)."""
    if master.startswith("sc://"):
        session = SparkSession.builder.remote(master).getOrCreate()
        for key, value in {**{k: SESSION_CONF[k] for k in RUNTIME_CONF}, **(conf or {})}.items():
            session.conf.set(key, value)
        return session
    # Embedded Spark binds to loopback: no traffic leaves the machine, no hostname warning.
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**SESSION_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client session (no SparkContext, no local JVM)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def task_slots(spark: SparkSession) -> int:
    """How many tasks the cluster runs at once (Spark's default parallelism).

    A Spark Connect client cannot ask the SparkContext, so it reads the server's settings:
    ``spark.default.parallelism``, else ``local[N]``, else executors times cores; failing all,
    2 (Spark's own floor), said in the log.
    """
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism

    def conf(name: str) -> str | None:
        try:
            return spark.conf.get(name, None)
        except Exception:  # a setting the server does not expose
            return None

    if (value := conf("spark.default.parallelism")) and value.isdigit():
        return int(value)
    master = conf("spark.master") or ""
    if m := re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master):
        return (os.cpu_count() or 2) if m.group(1) == "*" else int(m.group(1))
    instances, cores = conf("spark.executor.instances"), conf("spark.executor.cores")
    if instances and cores and instances.isdigit() and cores.isdigit():
        return int(instances) * int(cores)
    log.info("task slots of the Spark Connect server unknown (master %r); assuming 2: set "
             "spark.default.parallelism to tell", master)
    return 2
