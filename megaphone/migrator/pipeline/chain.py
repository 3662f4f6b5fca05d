"""A chain of stateful pipelines: each epoch runs them one after the other, each stage's
outputs (through an optional ``link`` transform) the next one's input, all in one Spark job
where it can (:func:`~megaphone.migrator.epoch.chain_job.run_chain_epoch`).

Every stage keeps its own bins, routing table and state directory and migrates on its own;
the stages share epoch numbers, so a stage that committed an epoch (or a stream's batch id)
already hands on its kept outputs instead of applying it twice (docs/operators.md, "Chains").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from megaphone.migrator.epoch.chain_job import Link, run_chain_epoch
from megaphone.migrator.pipeline.facade import Pipeline
from megaphone.migrator.pipeline.stream_runner import Sink
from megaphone.migrator.statedir.commit import StreamPosition
from megaphone.spark import adaptive_off, is_connect

#: Combines stage ``i``'s outputs of one worker and epoch where they are made (``combines``).
Combine = Callable[[pa.Table], pa.Table]

#: Partitions of the probe a link is tried on (:meth:`Chain._links_keep_partitions`).
PROBE_PARTITIONS = 3


class Chain:
    """Pipelines run in order every epoch; ``links[i]`` turns stage ``i``'s outputs into stage
    ``i + 1``'s input (default: as they are).

    With ``one_job`` (the default), an epoch that every stage still has to run is one Spark
    job: each stage's outputs reach the next stage's workers through Spark's shuffle, not
    through the driver, which gets the earlier stages' outputs and reports beside the job.
    ``one_job=False`` runs a job per stage (the stages' outputs through the driver), as an
    epoch that only the later stages still have to run always does, a chain whose link does
    not keep its input's partitions (a union), and any chain over Spark Connect.

    ``combines[i]``, when given, is stage ``i``'s outputs combined where they are made: a
    function of one worker's outputs of an epoch (a ``pyarrow.Table`` of the stage's outputs
    schema) that returns the rows stage ``i + 1`` needs of them, in that schema, before they
    are kept, leave the worker or reach the driver -- Beam's combiner lifting across a link.
    It must not change the chain's outputs: keep the rows the next stage would pick from
    anyway (NEXMark Q5 and Q7 keep each window's rows of the highest value, of which the top
    stage keeps the highest again), or fold rows as the next stage would fold them. Stage
    ``i``'s own outputs are then the combined ones.

    >>> windows = Pipeline(spark, "/tmp/q5a", key="auction", event_time="time",
    ...                    update=WindowAggregate(size_us=10_000_000))  # doctest: +SKIP
    >>> hottest = Pipeline(spark, "/tmp/q5b", key="end", value="count", update="max")
    ... # doctest: +SKIP
    >>> chain = Chain([windows, hottest], [lambda out: out.select(
    ...     out.output.end.cast("long").alias("end"), out.output.value.alias("count"))])
    ... # doctest: +SKIP
    >>> chain.process(bids)  # doctest: +SKIP
    >>> query = chain.start(bid_stream, lambda out, epoch: out.show())  # doctest: +SKIP
    >>> hottest.migrate(megaphone.rescale(hottest, workers=3))  # live  # doctest: +SKIP
    """

    def __init__(self, stages: Sequence[Pipeline], links: Sequence[Link | None] = (), *,
                 one_job: bool = True, combines: Sequence[Combine | None] = ()) -> None:
        if not stages:
            raise ValueError("a chain needs at least one pipeline")
        for name, given in (("links", links), ("combines", combines)):
            if len(given) > len(stages) - 1:
                raise ValueError(f"{len(given)} {name} for {len(stages)} stages (at most one "
                                 "between two stages)")
        if not all(c is None or callable(c) for c in combines):
            raise TypeError("a chain's combines are functions of a pyarrow Table (or None)")
        if len({id(s) for s in stages}) < len(stages):
            raise ValueError("a pipeline can be only one stage of a chain")
        self.stages = list(stages)
        self.links: list[Link | None] = [*links, *[None] * (len(stages) - 1 - len(links))]
        for stage, combine in zip(self.stages, [*combines, *[None] * len(stages)], strict=False):
            stage._driver.combine_outputs = combine
        self.one_job = one_job
        self._links_keep: bool | None = None  # :meth:`_links_keep_partitions`, once known
        self._check_epochs()

    def _check_epochs(self) -> None:
        """Refuse stages whose epochs no crash between two stages can explain."""
        epochs = [s.epoch for s in self.stages]
        if max(epochs) - min(epochs) > 1 or epochs != sorted(epochs, reverse=True):
            raise ValueError(
                f"the stages are at epochs {epochs}: a chain's stages commit the same epochs, "
                "and a crash can leave only the first ones one epoch ahead")

    @property
    def epoch(self) -> int:
        """The last epoch every stage committed (-1 before the first): the next batch fed
        runs epoch ``epoch + 1``."""
        return min(s.epoch for s in self.stages)

    def process(self, batch: DataFrame, *, input_end: float | None = None) -> DataFrame:
        """Run one epoch over ``batch`` through every stage; the last stage's outputs.

        A stage that committed this epoch already (before a crash) is not run again: its kept
        outputs go on to the next stage.
        """
        frame = self._process(batch, input_end, want_frame=True)[1]
        assert frame is not None
        return frame

    def process_arrow(self, batch: DataFrame, *, input_end: float | None = None) -> pa.Table:
        """Like :meth:`process`, but return the last stage's outputs as a ``pyarrow.Table`` on
        the driver, as :meth:`Pipeline.process_arrow <megaphone.Pipeline.process_arrow>` does:
        they reach the driver in the epoch's job results either way, and a sink in Python then
        needs no DataFrame of them, nor a Spark job to collect it (about 120 ms of a NEXMark Q3
        or Q8 epoch on two cores: bench/RESULTS.md, "NEXMark's outputs as Arrow").

        >>> chain.process_arrow(bids).to_pylist()  # doctest: +SKIP
        [{'end': 1700000010000000, 'output': {'auction': 7, 'value': 12}}]
        """
        return self._process(batch, input_end, want_frame=False)[0]

    def _process(self, batch: DataFrame, input_end: float | None, *, want_frame: bool
                 ) -> tuple[pa.Table, DataFrame | None]:
        """The next epoch through every stage: the last stage's outputs, and as a DataFrame
        when ``want_frame``."""
        epoch = self.epoch + 1
        if self._in_one_job(epoch):
            if any(s.streaming for s in self.stages):
                raise RuntimeError("a stage of the chain is running a stream; process() is not "
                                   "allowed")
            return self._one_epoch(batch, input_end, [None] * len(self.stages), want_frame)
        data, last = batch, len(self.stages) - 1
        for k, (stage, link) in enumerate(zip(self.stages, [*self.links, None], strict=True)):
            frame_wanted = want_frame or k < last
            if stage.epoch >= epoch:
                table = stage.state_dir.read_outputs(epoch)
                frame = stage._driver.outputs_frame(table) if frame_wanted else None
            else:
                table, frame = stage._process(data, input_end, None, want_frame=frame_wanted)
            if k < last:
                assert frame is not None
                data = frame if link is None else link(frame)
        return table, frame

    def _in_one_job(self, epoch: int) -> bool:
        """Whether ``epoch`` runs as one Spark job: ``one_job``, two stages or more, none of
        which ran it already, a classic Spark session (the stages' results reach the driver
        through an accumulator, which Spark Connect does not have), and no later stage that
        splits hot keys (its job reads its input twice, which would run the stage before's
        workers twice)."""
        return (self.one_job and len(self.stages) > 1 and not is_connect(self.stages[0].spark)
                and all(s.epoch == epoch - 1 for s in self.stages)
                and not any(s._driver.hot.may_split for s in self.stages[1:])
                and self._links_keep_partitions())

    def _links_keep_partitions(self) -> bool:
        """Whether every link keeps its input's partitions as they are, as a projection or a
        filter does. In one job Spark runs a link inside the tasks of the stage before it,
        whose partition is their worker: a link that unions or coalesces would renumber them,
        so such a chain runs a job per stage. Tried once per chain, on an empty probe of the
        stage's outputs in :data:`PROBE_PARTITIONS` partitions; not known (and the epoch runs a
        job per stage) while a stage's outputs schema is not, before its first epoch."""
        if self._links_keep is None:
            keep = True
            for stage, link in zip(self.stages, self.links, strict=False):
                if link is None:
                    continue
                driver, spark = stage._driver, stage.spark
                if driver.holder.key_type is None:
                    return False
                try:
                    schema = driver.outputs_schema()
                except (TypeError, ValueError):  # a value type the first epoch fixes
                    return False
                probe = spark.createDataFrame(
                    spark.sparkContext.parallelize([], PROBE_PARTITIONS), schema)
                with adaptive_off(spark):
                    keep = keep and link(probe).rdd.getNumPartitions() == PROBE_PARTITIONS
            self._links_keep = keep
        return self._links_keep

    def _one_epoch(self, batch: DataFrame, input_end: float | None,
                   streams: list[StreamPosition | None], want_frame: bool = True
                   ) -> tuple[pa.Table, DataFrame | None]:
        """The next epoch of every stage as one Spark job: the last stage's outputs, and as a
        DataFrame when ``want_frame``."""
        return run_chain_epoch([s._driver for s in self.stages], self.links, batch, input_end,
                               streams, want_frame)

    @property
    def streaming(self) -> bool:
        """True while a query started by :meth:`start` is running."""
        return self.stages[0].streaming

    def start(self, stream: DataFrame, sink: Sink, trigger: dict[str, Any] | None = None,
              checkpoint_location: str | None = None) -> Any:
        """Run on Structured Streaming: each micro-batch is one chain epoch through every
        stage in order; ``sink(outputs, epoch)`` gets the last stage's outputs (after no link).

        As :meth:`Pipeline.start <megaphone.Pipeline.start>` (``checkpoint_location`` defaults
        to the first stage's); returns the ``StreamingQuery``. Not over Spark Connect.
        """
        first = self.stages[0]
        if is_connect(first.spark):
            raise NotImplementedError(
                "Chain.start() does not run over Spark Connect (its micro-batches would have to "
                "open every stage on the server): run the chain's epochs with process(), or "
                "use a classic SparkSession")
        if any(s.streaming for s in self.stages):
            raise RuntimeError("a stage of the chain is running a stream: stop() it first")
        location = checkpoint_location or first._runner.local_location
        self._check_epochs()
        self._check_positions(location)
        return first._runner.start(stream, sink, trigger, location, None, run=self._run_batch,
                                   along=[s._runner for s in self.stages[1:]])

    def _run_batch(self, batch: DataFrame, batch_id: int, location: str
                   ) -> tuple[DataFrame, int]:
        """Micro-batch ``batch_id`` of the query at ``location`` as one chain epoch: the last
        stage's outputs and epoch. A stage that committed this batch id hands on its kept
        outputs (:meth:`StreamRunner.run_batch
        <megaphone.migrator.pipeline.stream_runner.StreamRunner.run_batch>`)."""
        data, epoch = batch, self.epoch
        if self._in_one_job(epoch + 1) and all(
                s._holder.commit.stream.ran(location) < batch_id for s in self.stages):
            position = StreamPosition(location, batch_id)
            frame = self._one_epoch(batch, None, [position] * len(self.stages))[1]
            assert frame is not None
            return frame, self.stages[-1].epoch
        for stage, link in zip(self.stages, [*self.links, None], strict=True):
            data, epoch = stage._runner.run_batch(data, batch_id, location)
            data = data if link is None else link(data)
        return data, epoch

    def _check_positions(self, location: str) -> None:
        """Refuse stages that the query at ``location`` would not keep in step: those at the
        last epoch must have committed one batch id of it, and those an epoch behind (a crash
        in a micro-batch) the one before, not stages an epoch of :meth:`process` put apart."""
        ran = [s._holder.commit.stream.ran(location) for s in self.stages]
        top = max(s.epoch for s in self.stages)
        ahead = {r for s, r in zip(self.stages, ran, strict=True) if s.epoch == top}
        behind = {r for s, r in zip(self.stages, ran, strict=True) if s.epoch < top}
        if len(ahead) > 1 or (behind and (min(ahead) < 0 or behind != {min(ahead) - 1})):
            raise ValueError(
                f"the stages are at epochs {[s.epoch for s in self.stages]} and committed "
                f"micro-batches {ran} of the query at {location}: they ran apart outside it "
                "(process() after a crash?), so its replay would not be recognised; finish a "
                "cut-short epoch with process() and start a query of another "
                "checkpoint_location")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the stream started by :meth:`start` between two micro-batches
        (:meth:`Pipeline.stop <megaphone.Pipeline.stop>`)."""
        self.stages[0].stop(timeout)

    def close(self) -> None:
        """Stop a running stream and close every stage."""
        self.stop()
        for stage in self.stages:
            stage.close()
