"""Relief order end to end: a live pipeline scaled out by a relief-ordered plan (made from the
per-bin load it measured) computes what a plain count without migration computes."""

from __future__ import annotations

from collections import Counter

import numpy as np

import megaphone
from megaphone import Pipeline
from megaphone.plans.relief import max_loads
from megaphone.routing.bins import bin_of

NUM_BINS = 8


def test_a_relief_ordered_scale_out_keeps_outputs_and_state(spark, tmp_path):
    pipe = Pipeline(spark, str(tmp_path / "p"), key="k", update="count", workers=2,
                    num_bins=NUM_BINS, key_type="int64")
    owners = pipe.routing.owners()
    hot = [k for k in range(200) if owners[bin_of(k, NUM_BINS)] == 0][:3]
    expected: Counter[int] = Counter()

    def epoch(e: int) -> None:
        # worker 0's three hot keys (6, 3 and 1 records), then 12 cold keys: a skewed epoch
        keys = [hot[0]] * 6 + [hot[1]] * 3 + [hot[2]] + [(e * 7 + i) % 40 for i in range(12)]
        expected.update(keys)
        out = pipe.process_arrow(spark.createDataFrame([(k,) for k in keys], "k long"))
        assert dict(zip(out.column("k").to_pylist(), out.column("count").to_pylist(),
                        strict=True)) == {k: expected[k] for k in set(keys)}

    for e in range(2):
        epoch(e)
    load = pipe.bin_load()
    assert load[bin_of(hot[0], NUM_BINS)] > 0  # measured per bin, the hot keys' records in it
    plan = megaphone.rescale(pipe, workers=4, strategy="fluid", balance="load")
    bins = megaphone.rescale(pipe, workers=4, strategy="fluid", balance="load", order="bins")
    assert plan.meta["order"] == "relief" and bins.meta["order"] == "bins"
    assert sorted(plan.moves) == sorted(bins.moves) and len(plan.steps) > 1
    steps = [list(s.moves) for s in plan.steps]
    assert max_loads(steps, owners, load)[0] <= max_loads([list(s.moves) for s in bins.steps],
                                                           owners, load)[0]
    assert steps[0][0].src == int(np.argmax(np.bincount(owners, weights=load)))
    handle = megaphone.migrate(plan, pipe)
    e = 2
    while not handle.done:
        epoch(e)
        e += 1
    epoch(e)
    assert e == 2 + len(plan.steps)
    assert [pipe.routing.owner(m.bin) for m in plan.moves] == [m.dst for m in plan.moves]
    assert {r[0]: r[1] for r in pipe.state().collect()} == dict(expected)
    pipe.close()
