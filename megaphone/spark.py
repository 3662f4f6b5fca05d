"""One place that builds the SparkSession megaphone runs on (embedded or on a cluster)."""

from __future__ import annotations

import os
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


def spark_session(
    master: str = "local[*]", app_name: str = "megaphone", conf: dict[str, str] | None = None
) -> SparkSession:
    """Return a SparkSession with megaphone's settings; ``master`` may name any cluster."""
    # Embedded Spark binds to loopback: no traffic leaves the machine, no hostname warning.
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**SESSION_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
