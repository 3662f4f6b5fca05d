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
from megaphone.migrator.task.state_operator import apply_worker, result_schema
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
    in_job = last  # the job's last stage: the one before an idle last stage, if there is one

    def submit(k: int, run: EpochRun) -> DataFrame:
        """Stage ``k``'s job; for all but the job's last, what the next stage reads of it:
        its outputs through the link."""
        if k == in_job:
            return run.job()
        passed.append(run.passed_on())
        job = run.job(passed[-1])
        return job if links[k] is None else links[k](job)

    rows = batch
    for k, (driver, stream) in enumerate(zip(drivers, streams, strict=True)):
        run = EpochRun(driver, EpochSource(rows, stream=stream), 1, input_end)
        runs.append(run)
        run.prepare()
        if k == last - 1 and emits_nothing(run):
            in_job = k
        with run.phase("submit"):
            rows = submit(k, run)
        if in_job == k < last:
            idle = EpochRun(drivers[last], EpochSource(_no_outputs(run, links[k]),
                                                       stream=streams[last]), 1, input_end)
            runs.append(idle)
            idle.prepare()
            break
    job_runs = runs[:in_job + 1]

    def rebuild() -> DataFrame:
        """The whole job again (a rerun after a retryable failure), with new hand-overs."""
        passed.clear()
        again = batch
        for k, run in enumerate(job_runs):
            run.source = dataclasses.replace(run.source, batch=again)
            again = submit(k, run)
        return again

    with contextlib.ExitStack() as phases:
        for run in runs:
            phases.enter_context(run.phase("collect"))
        bounds = [row_bytes_bound(run.spec) for run in job_runs]  # one job: its widest rows
        row_bytes = None if None in bounds else max(b for b in bounds if b is not None)
        results, attempts = run_job(rows, rebuild, runs[0].epoch, row_bytes)
        tables = [hand_over.table(run.spec) for hand_over, run in zip(passed, runs, strict=False)]
        tables.append(results)
        reports = [run.reports(table) for run, table in zip(job_runs, tables, strict=True)]
        if in_job < last:
            _check_silent(job_runs[-1], reports[-1][0].outputs.num_rows)
            reports.append(runs[-1].reports(_idle_epoch(runs[-1])))
        outputs = reports[-1][0].outputs
        # before any commit point
        frame = drivers[-1].outputs_frame(outputs) if want_frame else None
    for run, report in zip(runs, reports, strict=True):
        run.attempts = attempts
        run.finish(report)
    return outputs, frame


def emits_nothing(run: EpochRun) -> bool:
    """Whether stage ``run`` provably emits nothing in its epoch (docs/operators.md, "Idle
    later stages"): its update declares that only its timers bring outputs, and that none of
    them can be due between the watermark of its last epoch (committed by this driver: not
    known after a restart) and this one's."""
    fn = run.spec.update.fn if run.spec.update.is_process else None
    last = run.driver.last_watermark
    if fn is None or getattr(fn, "emits_on_records", True) or run.grouped or last is None \
            or last[0] != run.epoch - 1 or not hasattr(fn, "timers_between"):
        return False
    return not fn.timers_between(last[1], run.spec.watermark)


def _no_outputs(run: EpochRun, link: Link | None) -> DataFrame:
    """The next stage's input when stage ``run`` emits nothing: its link over none of its
    outputs (an empty local relation: no job)."""
    empty = run.driver.outputs_frame(run.spec.output_schema.empty_table())
    return empty if link is None else link(empty)


def _check_silent(run: EpochRun, emitted: int) -> None:
    """Refuse (before any commit) the epoch of a stage that emitted rows where its update
    declared it could not: the idle stage after it would have missed them."""
    if emitted:
        fn = run.spec.update.fn
        raise RuntimeError(
            f"epoch {run.epoch}: {type(fn).__name__} emitted {emitted} rows although its "
            "emits_on_records and timers_between said it would emit none; the chain's epoch "
            "is not committed (fix the declarations)")


def _idle_epoch(run: EpochRun) -> pa.Table:
    """The results of an idle last stage's epoch (no input): its workers' tasks run in this
    process, as offline migration runs them, where Spark is embedded here and no bin moves;
    else as a Spark job of their own."""
    spec, layout = run.spec, run.layout
    local = run.driver.spark.sparkContext.master.startswith("local")
    if local and not (layout.incoming or layout.outgoing or spec.homes or spec.split_keys):
        batches = [b for w in range(layout.partitions) for b in apply_worker(spec, w, iter(()))]
        return pa.Table.from_batches(batches, result_schema(spec.output_schema, spec.grouped))
    return run_job(run.job(), run.job, run.epoch, row_bytes_bound(spec))[0]
