"""A chain's epoch as one Spark job (``Chain(one_job=True)``, the default): with any plans on
either stage (random bins and epochs, scale out and in), each stage's outputs, kept outputs,
metrics and final state equal a plain-Python run of the chain epoch by epoch, and the first
stage's outputs never become a DataFrame on the driver. ``one_job=False`` runs a job per stage,
with the same results."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from megaphone import Chain, MigrationPlan, Move, Pipeline
from megaphone.migrator.epoch.driver import EpochDriver
from tests.test_chain_stream import CHAIN_BINS, chain_of, reference


def plan_for(stage: Pipeline, moves: list[tuple[int, int]]) -> MigrationPlan:
    """Moves of (bin, new worker) in steps of two, from the stage's routing now."""
    routing = stage.routing
    picked = [Move(b, routing.owner(b), w) for b, w in dict(moves).items()
              if w != routing.owner(b)]
    return MigrationPlan.from_moves(routing, [picked[i:i + 2] for i in range(0, len(picked), 2)])


def as_dict(table) -> dict[int, int]:
    return dict(zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True))


# Plans of each stage: (epoch submitted, [(bin, new worker)]): workers 0-3 (out and in).
PLANS = st.tuples(st.integers(0, 3), st.lists(st.tuples(st.integers(0, CHAIN_BINS - 1),
                                                        st.integers(0, 3)), max_size=6))


@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(batches=st.lists(st.lists(st.integers(0, 15), max_size=10), min_size=1, max_size=4),
       plans=st.tuples(PLANS, PLANS))
def test_one_job_equals_the_reference_with_any_plans(spark, batches, plans):
    firsts, seconds, final = reference(batches)
    with tempfile.TemporaryDirectory() as root:
        chain = chain_of(spark, Path(root), one_job=True)
        counts, sums = chain.stages
        for epoch, keys in enumerate(batches):
            for stage, (at, moves) in zip(chain.stages, plans, strict=True):
                if at == epoch and moves:
                    stage.migrate(plan_for(stage, moves))
            batch = spark.createDataFrame([(k,) for k in keys], "k long")
            out = chain.process_arrow(batch) if epoch % 2 else chain.process(batch).toArrow()
            assert as_dict(out) == seconds[epoch]
            assert as_dict(counts.state_dir.read_outputs(epoch)) == firsts[epoch]
            assert as_dict(sums.state_dir.read_outputs(epoch)) == seconds[epoch]
        assert {r[0]: r[1] for r in sums.state().collect()} == final
        for stage in chain.stages:
            records = stage.metric_records()
            assert [r.epoch for r in records] == list(range(len(batches)))
            assert [r.job_attempts for r in records] == [1] * len(batches)
        assert [r.records_in for r in counts.metric_records()] == [len(b) for b in batches]
        chain.close()


@pytest.fixture
def frames(monkeypatch) -> list[str]:
    """The stages (their state directories' names) whose outputs are made a DataFrame on the
    driver, in order."""
    made_by: list[str] = []
    made = EpochDriver.outputs_frame

    def outputs_frame(self, outputs):
        made_by.append(self.holder.state_dir.path.name)
        return made(self, outputs)

    monkeypatch.setattr(EpochDriver, "outputs_frame", outputs_frame)
    return made_by


def test_the_first_stage_outputs_skip_the_driver_unless_one_job_is_off(spark, tmp_path, frames):
    batches = [[1, 2, 2], [2, 3]]
    _, seconds, _ = reference(batches)
    for one_job in (True, False):
        frames.clear()
        chain = chain_of(spark, tmp_path / str(one_job), one_job)
        for epoch, keys in enumerate(batches):
            out = chain.process(spark.createDataFrame([(k,) for k in keys], "k long"))
            assert as_dict(out.toArrow()) == seconds[epoch]
        assert frames == (["sums", "sums"] if one_job else ["counts", "sums"] * 2)
        chain.close()


def test_process_arrow_gives_the_outputs_and_no_frame_of_the_last_stage(spark, tmp_path,
                                                                         frames):
    """``Chain.process_arrow``: the outputs ``process`` gives, as a table, and the last stage's
    never a DataFrame, in one job or a job per stage, and when the first stage committed the
    epoch before (a crash between the stages) and hands on its kept outputs."""
    batches = [[1, 2, 2], [2, 3], [3, 3, 4]]
    _, seconds, final = reference(batches)
    for one_job in (True, False):
        chain = chain_of(spark, tmp_path / str(one_job), one_job)
        counts, sums = chain.stages
        frames.clear()
        for epoch, keys in enumerate(batches[:2]):
            out = chain.process_arrow(spark.createDataFrame([(k,) for k in keys], "k long"))
            assert isinstance(out, pa.Table) and as_dict(out) == seconds[epoch]
        assert frames == ([] if one_job else ["counts", "counts"])
        last = spark.createDataFrame([(k,) for k in batches[2]], "k long")
        counts.process(last)  # the first stage alone commits epoch 2
        frames.clear()
        assert as_dict(chain.process_arrow(last)) == seconds[2]
        assert frames == ["counts"]  # its kept outputs, for the second stage
        assert {r[0]: r[1] for r in sums.state().collect()} == final
        chain.close()


def test_an_epoch_without_outputs_gives_a_frame_acting_on_it_runs_no_job(spark, tmp_path):
    chain = chain_of(spark, tmp_path, one_job=True)
    out = chain.process(spark.createDataFrame([], "k long"))
    sc = spark.sparkContext
    sc.setJobGroup("empty-outputs", "collecting an empty epoch's outputs")
    try:
        assert out.select("k").collect() == []
        assert sc.statusTracker().getJobIdsForGroup("empty-outputs") == []
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    full = chain.process(spark.createDataFrame([(1,)], "k long"))  # the same frame, with rows
    assert full.count() == 1 and out.schema == full.schema
    chain.close()


def test_a_link_that_renumbers_partitions_runs_a_job_per_stage(spark, tmp_path):
    # A self-union would run inside the first stage's tasks, renumbering its workers' partitions.
    batches = [[1, 2, 2], [2, 3]]
    for link, doubled in ((lambda out: out.unionByName(out), True),
                          (lambda out: out.where("count > 0"), False)):
        chain = chain_of(spark, tmp_path / str(doubled), one_job=True)
        chain.links = [link]
        sums: Counter = Counter()
        for i, keys in enumerate(batches):
            out = chain.process(spark.createDataFrame([(k,) for k in keys], "k long"))
            for k in set(keys):
                sums[k] += Counter(k for b in batches[:i + 1] for k in b)[k] * (2 if doubled else 1)
            assert as_dict(out.toArrow()) == {k: sums[k] for k in set(keys)}
        assert chain._links_keep_partitions() is not doubled
        chain.close()


@pytest.mark.parametrize("one_job", [True, False])
def test_a_combine_cuts_a_stage_outputs_at_its_workers(spark, tmp_path, one_job):
    """``combines[0]`` runs on the first stage's outputs at each worker, before they are kept
    (its kept outputs are the combined ones) and before the next stage reads them, in one job
    or a job per stage alike."""
    def odd_counts(outputs: pa.Table) -> pa.Table:  # nested: the workers get it by value
        """Drops the keys whose count is even (the sums stage then never sees them): not a
        combine that leaves the chain's outputs as they are, so that its effect shows."""
        return outputs.filter(pc.equal(pc.bit_wise_and(outputs.column(1), 1), 1))

    chain = Chain(chain_of(spark, tmp_path, one_job=one_job).stages, combines=[odd_counts],
                  one_job=one_job)
    counts = chain.stages[0]
    batches = [[1, 2, 2, 3], [2, 3, 3, 4]]
    firsts, _, _ = reference(batches)
    total: Counter = Counter()
    kept = []
    for epoch, keys in enumerate(batches):
        out = chain.process_arrow(spark.createDataFrame([(k,) for k in keys], "k long"))
        odd = {k: n for k, n in firsts[epoch].items() if n % 2}
        assert as_dict(counts.state_dir.read_outputs(epoch)) == odd
        total.update(odd)
        kept.append(len(odd))
        assert as_dict(out) == {k: total[k] for k in odd}
    assert [r.records_out for r in counts.metric_records()] == kept == [2, 3]
    chain.close()


def test_a_combine_that_changes_the_schema_fails_the_epoch(spark, tmp_path):
    """A combine must give back a table of its input's schema: anything else fails the epoch
    loudly, naming the combine, and no stage commits it."""
    def renamed(outputs: pa.Table) -> pa.Table:
        return outputs.rename_columns(["key", "n"])

    chain = Chain(chain_of(spark, tmp_path).stages, combines=[renamed])
    with pytest.raises(Exception, match="combine 'renamed' must return a pyarrow Table"):
        chain.process_arrow(spark.createDataFrame([(1,)], "k long"))
    assert [s.epoch for s in chain.stages] == [-1, -1]
    with pytest.raises(ValueError, match="2 combines for 2 stages"):
        Chain(chain.stages, combines=[renamed, renamed])
    with pytest.raises(TypeError, match="functions of a pyarrow Table"):
        Chain(chain.stages, combines=["top"])
    chain.close()
