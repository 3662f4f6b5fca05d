"""An idle last stage of a chain (docs/operators.md, "Idle later stages"): in an epoch whose
stage before provably emits nothing (a window aggregate in append mode that no window closes
in), the last stage's epoch runs without a Spark stage of its own, and every stage's outputs,
kept outputs and final state equal the same chain run with every stage in the job. A stage
that emits rows where its declarations said it could not fails the epoch before any commit."""

from __future__ import annotations

import tempfile
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from megaphone import Chain, Pipeline, WindowAggregate
from megaphone.migrator.epoch import chain_job

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _by_end(out):
    """The windows' counts keyed by their end (the link)."""
    return out.select(out.output.end.cast("long").alias("end"), out.output.value.alias("n"))


def windows_then_sums(spark, root: Path, size_s: int) -> Chain:
    """Counts per key and tumbling window (closing when the watermark passes them), then
    per window end the sum of those counts."""
    opts = {"workers": 2, "num_bins": 8, "backend": "memory"}
    windows = Pipeline(spark, str(root / "w"), key="k", event_time="t", key_type="int64",
                       update=WindowAggregate(size_us=size_s * 1_000_000),
                       pipeline_id=uuid.uuid4().hex, **opts)
    sums = Pipeline(spark, str(root / "s"), key="end", value="n", update="sum",
                    key_type="int64", pipeline_id=uuid.uuid4().hex, **opts)
    return Chain([windows, sums], [_by_end])


def rows_of(table) -> list:
    return sorted(map(tuple, (r.values() for r in table.to_pylist())))


# Epochs of (key, second) records: event time moves on a second or two an epoch, so 4 s
# windows close in some epochs and not in others.
EPOCHS = st.lists(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2)), max_size=6),
                  min_size=2, max_size=6)


@settings(max_examples=4, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(epochs=EPOCHS)
@example(epochs=[[(1, 0)], [(2, 1)], [(3, 0)], [(4, 1)]])  # watermarks -, 0, 3, 4 s: idle at 2
def test_an_idle_last_stage_equals_the_chain_in_one_job(spark, epochs):
    runs: list[list] = []
    idle_epochs: list[int] = []
    for idle in (True, False):
        with tempfile.TemporaryDirectory() as root, pytest.MonkeyPatch.context() as mp:
            if not idle:
                mp.setattr(chain_job, "emits_nothing", lambda run: False)
            else:
                made = chain_job._idle_epoch

                def spy(run, made=made):
                    idle_epochs.append(run.epoch)
                    return made(run)

                mp.setattr(chain_job, "_idle_epoch", spy)
            chain = windows_then_sums(spark, Path(root), size_s=4)
            windows, sums = chain.stages
            got = []
            for e, records in enumerate(epochs):
                batch = spark.createDataFrame(
                    [(k, T0 + timedelta(seconds=2 * e + s)) for k, s in records],
                    "k long, t timestamp")
                out = chain.process_arrow(batch)
                got.append((rows_of(out), rows_of(windows.state_dir.read_outputs(e)),
                            rows_of(sums.state_dir.read_outputs(e))))
            got.append(sorted(map(tuple, sums.state().collect())))
            got.append(sorted(str(r) for r in windows.state().collect()))
            runs.append(got)
            chain.close()
    assert runs[0] == runs[1]
    # the first epoch runs in one job (no watermark before it); later ones close a window
    # (4 s windows, 2 s epochs) in about every other epoch
    assert 0 not in idle_epochs
    if len(epochs) >= 4 and any(epochs[1:]):
        assert idle_epochs


def test_a_stage_that_emits_where_it_said_it_would_not_fails_the_epoch(spark, tmp_path):
    class Lying(WindowAggregate):
        """Emits on records (update mode) and says it does not."""

        @property
        def emits_on_records(self) -> bool:
            return False

    batch = spark.createDataFrame([(1, T0)], "k long, t timestamp")
    lying = Pipeline(spark, str(tmp_path / "w2"), key="k", event_time="t", key_type="int64",
                     update=Lying(size_us=4_000_000, emit="update"), workers=2, num_bins=8,
                     backend="memory", pipeline_id=uuid.uuid4().hex)
    sums2 = Pipeline(spark, str(tmp_path / "s2"), key="end", value="n", update="sum",
                     key_type="int64", workers=2, num_bins=8, backend="memory",
                     pipeline_id=uuid.uuid4().hex)
    liar = Chain([lying, sums2], [_by_end])
    for _ in range(2):  # the second knows the first's watermark: it runs in one job too
        liar.process_arrow(batch)
    with pytest.raises(Exception, match="emitted 1 rows although its emits_on_records"):
        liar.process_arrow(spark.createDataFrame([(2, T0)], "k long, t timestamp"))
    assert [s.epoch for s in liar.stages] == [1, 1]
    liar.close()


def test_window_timers_between_watermarks() -> None:
    """A window end (a multiple of the slide plus the size) in ``(after, upto]``."""
    tumbling = WindowAggregate(size_us=10)
    sliding = WindowAggregate(size_us=10, slide_us=4)  # ends 2, 6, 10, 14, ... (mod 4 = 2)
    assert not tumbling.timers_between(10, 19) and tumbling.timers_between(10, 20)
    assert tumbling.timers_between(-1, 0) and not tumbling.timers_between(0, 0)
    assert not sliding.timers_between(6, 9) and sliding.timers_between(6, 10)
    assert sliding.timers_between(-3, -2)  # -2 is an end
    assert tumbling.timers_between(None, 5) and not tumbling.timers_between(5, None)
    assert WindowAggregate(size_us=10, emit="update").emits_on_records
    assert not tumbling.emits_on_records
