"""Epochs whose input is local data (a DataFrame made from Python or Arrow data), with and
without Spark's ``ConvertToLocalRelation`` optimizer rule.

That rule computes a projection over local data row by row in the interpreter, before
constants are folded, so the routing projection (``owner_column``: a bin's worker looked up in
an array built from one string literal) rebuilt the owner array for every record. A pipeline
now turns the rule off on its session (``megaphone.spark.apply_pipeline_settings``). One
pipeline (string keys, ``--bins`` bins, 2 workers) runs ``--epochs`` epochs of ``--records``
local records in each setting, alternating epoch by epoch, after one warm-up epoch each;
prints the medians and their ratio.

    python bench/local_input.py                       # 20,000 records, 4,096 bins, 8 epochs each
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import megaphone
from megaphone.spark import LOCAL_RELATION_RULE, spark_session

RULES = "spark.sql.optimizer.excludedRules"


def main(argv: list[str] | None = None) -> int:
    """Run both settings side by side and print the medians."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--bins", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=8)
    args = p.parse_args(argv)
    spark = spark_session("local[2]", "megaphone-bench-local-input")
    rng = np.random.default_rng(7)
    settings = {"rule off (now)": LOCAL_RELATION_RULE, "rule on (before)": ""}
    took: dict[str, list[float]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as root:
        pipe = megaphone.Pipeline(spark, root, key="key", update="count", workers=2,
                                  num_bins=args.bins, key_type="str")
        for i in tqdm(range(args.epochs + 1), desc="epochs"):
            for name in (list(settings) if i % 2 == 0 else list(settings)[::-1]):
                keys = rng.integers(0, 1_000_000, args.records).astype(str)
                df = spark.createDataFrame(pa.table({"key": pa.array(keys, pa.string())}))
                spark.conf.set(RULES, settings[name])
                t0 = time.perf_counter()
                pipe.process_arrow(df)
                if i:  # the first round warms both up
                    took[name].append(time.perf_counter() - t0)
        spark.conf.set(RULES, LOCAL_RELATION_RULE)
        pipe.close()
    print(f"{args.records:,} local records an epoch, {args.bins} bins, string keys, 2 workers, "
          f"{args.epochs} epochs each (alternating)")
    print("| setting | epoch median (s) | min | max |")
    print("|---|---:|---:|---:|")
    for name, t in took.items():
        print(f"| {name} | {statistics.median(t):.3f} | {min(t):.3f} | {max(t):.3f} |")
    ratio = statistics.median(took["rule on (before)"]) / statistics.median(took["rule off (now)"])
    print(f"before / now: {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
