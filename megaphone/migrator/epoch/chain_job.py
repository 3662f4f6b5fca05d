"""A chain's epoch as one Spark job (docs/operators.md, "A chain's epoch in one job"): the
stages' runs are prepared in order, stage ``k``'s job yields its workers' outputs as its rows,
which stage ``k + 1``'s job reads through the link, so they go from one stage's workers to the
next through Spark's shuffle, and only the last stage's job is collected. The earlier stages'
results (their outputs and reports) reach the driver through a Spark accumulator
(:class:`~megaphone.migrator.epoch.spark_job.PassedOn`). After the job the stages commit in
order, each as its own run would, so a crash between two commits leaves what a chain of
separate jobs leaves.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import DataFrame

from megaphone.migrator.epoch.run import EpochRun, EpochSource
from megaphone.migrator.epoch.spark_job import PassedOn, run_job
from megaphone.migrator.task.spec import row_bytes_bound
from megaphone.spark import check_python_workers

if TYPE_CHECKING:
    from megaphone.migrator.epoch.driver import EpochDriver
    from megaphone.migrator.statedir.commit import StreamPosition

#: Turns a stage's outputs into the next stage's input.
Link = Callable[[DataFrame], DataFrame]


def run_chain_epoch(drivers: Sequence[EpochDriver], links: Sequence[Link | None],
                    batch: DataFrame, input_end: float | None,
                    streams: Sequence[StreamPosition | None], want_frame: bool = True
                    ) -> tuple[pa.Table, DataFrame | None]:
    """Run the next epoch of every stage (``drivers``, all at the same epoch) over ``batch``
    as one Spark job: the last stage's outputs, as a table and, when ``want_frame``, a
    DataFrame (made before any commit point). ``links[k]`` turns stage ``k``'s outputs into
    stage ``k + 1``'s input; ``streams[k]``: stage ``k``'s micro-batch position, for a
    stream's batch. The holders are locked in the stages' order for the whole epoch; a failure
    before a stage's commit leaves its holder to roll its workers back, as a failed run of its
    own would."""
    check_python_workers(drivers[0].spark)
    runs: list[EpochRun] = []
    with contextlib.ExitStack() as locks:
        for driver in drivers:
            locks.enter_context(driver.holder.lock)
        try:
            return _run(drivers, links, batch, input_end, streams, runs, want_frame)
        except BaseException:
            for run in runs:
                run.holder.failed(run.last)
            raise


def _run(drivers: Sequence[EpochDriver], links: Sequence[Link | None], batch: DataFrame,
         input_end: float | None, streams: Sequence[StreamPosition | None],
         runs: list[EpochRun], want_frame: bool) -> tuple[pa.Table, DataFrame | None]:
    passed: list[PassedOn] = []

    last = len(drivers) - 1

    def submit(k: int, run: EpochRun) -> DataFrame:
        """Stage ``k``'s job; for all but the last, what the next stage reads of it: its
        outputs through the link."""
        if k == last:
            return run.job()
        passed.append(run.passed_on())
        job = run.job(passed[-1])
        return job if links[k] is None else links[k](job)

    rows = batch
    for k, (driver, stream) in enumerate(zip(drivers, streams, strict=True)):
        run = EpochRun(driver, EpochSource(rows, stream=stream), 1, input_end)
        runs.append(run)
        run.prepare()
        with run.phase("submit"):
            rows = submit(k, run)

    def rebuild() -> DataFrame:
        """The whole job again (a rerun after a retryable failure), with new hand-overs."""
        passed.clear()
        again = batch
        for k, run in enumerate(runs):
            run.source = dataclasses.replace(run.source, batch=again)
            again = submit(k, run)
        return again

    with contextlib.ExitStack() as phases:
        for run in runs:
            phases.enter_context(run.phase("collect"))
        bounds = [row_bytes_bound(run.spec) for run in runs]  # one job: its widest rows
        row_bytes = None if None in bounds else max(b for b in bounds if b is not None)
        results, attempts = run_job(rows, rebuild, runs[0].epoch, row_bytes)
        tables = [hand_over.table(run.spec) for hand_over, run in zip(passed, runs, strict=False)]
        reports = [run.reports(table) for run, table in zip(runs, [*tables, results], strict=True)]
        outputs = reports[-1][0].outputs
        # before any commit point
        frame = drivers[-1].outputs_frame(outputs) if want_frame else None
    for run, report in zip(runs, reports, strict=True):
        run.attempts = attempts
        run.finish(report)
    return outputs, frame
