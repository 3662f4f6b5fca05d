"""A driver whose Spark Python workers cannot run megaphone (``tests/test_worker_python.py``).

Three sessions one after the other in one process (one JVM): the default one, whose workers
must run on this interpreter whatever ``python3`` is on ``PATH``; one whose workers' interpreter
shadows megaphone with a package that fails to import; one whose workers run another Python
version (when the machine has one). Prints a JSON line of what each first epoch did.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from pyspark.sql import SparkSession

from megaphone import Pipeline
from megaphone.spark import WorkerPythonError, spark_session


def first_epoch(spark: SparkSession, state_dir: str) -> dict:
    """Run one epoch; what happened to it and to the pipeline."""
    pipe = Pipeline(spark, state_dir, key="k", update="count", workers=2, num_bins=16,
                    key_type="int64")
    try:
        rows = pipe.process(spark.createDataFrame([(k,) for k in range(10)], "k long")).collect()
        result = {"rows": len(rows)}
    except WorkerPythonError as error:
        result = {"error": str(error)}
    result["epoch"] = pipe.epoch
    result["python_exec"] = spark.sparkContext.pythonExec
    pipe.close()
    spark.stop()
    return result


def main() -> None:
    shadowing_python, other_python = sys.argv[1], sys.argv[2]
    results = {}
    with tempfile.TemporaryDirectory() as d:
        os.environ.pop("PYSPARK_PYTHON", None)
        results["default"] = first_epoch(spark_session("local[2]"), f"{d}/default")
        os.environ["PYSPARK_PYTHON"] = shadowing_python  # the user's explicit choice
        results["shadowed"] = first_epoch(spark_session("local[2]"), f"{d}/shadowed")
        if other_python:
            os.environ["PYSPARK_PYTHON"] = other_python
            results["other_version"] = first_epoch(spark_session("local[2]"), f"{d}/other")
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
