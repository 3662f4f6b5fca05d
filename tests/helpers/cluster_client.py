"""Drive a counting pipeline on a Spark standalone cluster whose executors cannot see the
driver's state directory (two simulated hosts), and record what happened.

Usage: ``python -m tests.helpers.cluster_client MASTER STATE_DIR LOCAL_DIR OUT_JSON``.
"""

from __future__ import annotations

import json
import sys

from megaphone import Pipeline
from megaphone.spark import spark_session

#: Settings for executors on simulated hosts: each reads only its own shuffle files.
CLUSTER_CONF = {"spark.shuffle.readHostLocalDisk": "false", "spark.executor.cores": "1",
                "spark.cores.max": "2", "spark.executor.memory": "768m",
                "spark.task.maxFailures": "2",
                # both hosts' executors are up before the first job is scheduled
                "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s"}


def main(master: str, state_dir: str, local_dir: str, out: str) -> None:
    spark = spark_session(master, "megaphone-cluster-test", CLUSTER_CONF)
    pipe = Pipeline(spark, state_dir, key="k", update="count", workers=2, num_bins=16,
                    key_type="int64", local_dir=local_dir)
    try:
        pipe.process(spark.createDataFrame([(k,) for k in range(40)], "k long"))
        error = None
    except Exception as exc:  # what the user sees
        error = str(exc)
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    with open(out, "w") as fh:
        json.dump({"error": error, "epoch": pipe.epoch, "executors": executors}, fh)
    pipe.close()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
