"""A chain of stateful pipelines: each epoch runs them one after the other, each stage's
outputs (through an optional ``link`` transform) the next one's input.

Every stage keeps its own bins, routing table and state directory, so each migrates on its
own (``chain.stages[i].migrate(plan)``). An epoch is one Spark job per stage, run in order;
the stages' outputs reach the next stage through the driver, as every epoch's outputs do.

Exactly once: the stages share epoch numbers. If a crash left the first stages one epoch
ahead of the last ones, :attr:`Chain.epoch` is the last epoch every stage committed, the
caller feeds the next batch again, and stages that committed that epoch already hand on their
kept outputs (``Pipeline(keep_outputs=...)`` epochs of them) instead of applying it twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import DataFrame

from megaphone.migrator.pipeline.facade import Pipeline

Link = Callable[[DataFrame], DataFrame]


class Chain:
    """Pipelines run in order every epoch; ``links[i]`` turns stage ``i``'s outputs into stage
    ``i + 1``'s input (default: as they are).

    >>> windows = Pipeline(spark, "/tmp/q5a", key="auction", event_time="time",
    ...                    update=WindowAggregate(size_us=10_000_000))  # doctest: +SKIP
    >>> hottest = Pipeline(spark, "/tmp/q5b", key="end", value="count", update="max")
    ... # doctest: +SKIP
    >>> chain = Chain([windows, hottest], [lambda out: out.select(
    ...     out.output.end.cast("long").alias("end"), out.output.value.alias("count"))])
    ... # doctest: +SKIP
    >>> chain.process(bids)  # doctest: +SKIP
    """

    def __init__(self, stages: Sequence[Pipeline], links: Sequence[Link | None] = ()) -> None:
        if not stages:
            raise ValueError("a chain needs at least one pipeline")
        if len(links) > len(stages) - 1:
            raise ValueError(f"{len(links)} links for {len(stages)} stages (at most one between "
                             "two stages)")
        if len({id(s) for s in stages}) < len(stages):
            raise ValueError("a pipeline can be only one stage of a chain")
        self.stages = list(stages)
        self.links: list[Link | None] = [*links, *[None] * (len(stages) - 1 - len(links))]
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
        epoch = self.epoch + 1
        data = batch
        for i, stage in enumerate(self.stages):
            if stage.epoch >= epoch:
                data = stage._driver.read_outputs(epoch)
            else:
                data = stage.process(data, input_end=input_end)
            link = self.links[i] if i < len(self.links) else None
            if link is not None:
                data = link(data)
        return data

    def close(self) -> None:
        """Close every stage."""
        for stage in self.stages:
            stage.close()
