"""The demo's input and its closing lines."""

from pyspark.sql import functions as F

from megaphone.demo import EpochFeed, next_steps, words
from megaphone.plans.handle import MigrationHandle
from megaphone.plans.plan import MigrationPlan
from megaphone.routing.fingerprint import Fingerprint
from megaphone.routing.table import Move, RoutingTable


def test_words_are_exactly_the_announced_ones(spark):
    """Every value maps to one of w0..w{keys-1}, and enough values reach all of them (a
    negative hash modulo keys made up to twice the words announced)."""
    keys = 50
    got = {r.word for r in spark.range(20_000).select(words(F.col("id"), keys).alias("word"))
           .distinct().collect()}
    assert got == {f"w{i}" for i in range(keys)}


def test_next_steps_name_the_state_and_the_commands():
    kept = next_steps("/data/demo", kept=True)
    temp = next_steps("/tmp/megaphone-demo-x", kept=False)
    for command in ("inspect", "explain", "plan", "migrate"):
        assert f"megaphone {command} --state-dir /data/demo" in kept
    assert "rm -r /tmp/megaphone-demo-x" in temp and "rm -r" not in kept


def test_next_steps_over_connect_delete_the_checkpoint_and_skip_explain():
    text = next_steps("/tmp/d", kept=False, checkpoint="/tmp/d-checkpoint", traced=False)
    assert "rm -r /tmp/d /tmp/d-checkpoint" in text
    assert "megaphone explain --state-dir" not in text and "traces" in text
    assert "megaphone inspect --state-dir /tmp/d " in text


def test_the_epoch_feed_prints_each_epoch_once_in_the_phase_of_the_plans_steps(capsys):
    """Phases come from the plan's step epochs, not from when the feed is polled: epochs
    before the first step are steady, up to the last one migrating (while the plan is not done,
    every later epoch), after it after; an epoch read twice is printed once."""
    metrics: list[dict] = []

    def epoch(e: int) -> None:
        metrics.append({"epoch": e, "records_in": 10, "latency_s": 0.5, "bins_moved": 0,
                        "keys_moved": 0, "workers": 2})

    table = RoutingTable.initial(Fingerprint("p", 8, "str"), 2)
    handle = MigrationHandle(MigrationPlan.from_moves(table, [[Move(2, 0, 2)], [Move(3, 1, 3)]]))
    feed = EpochFeed(lambda after: list(metrics), after=0)
    for e in range(4):  # epoch 0 ran before: not printed
        epoch(e)
    feed.handle = handle
    feed.poll()
    handle.step_committed(4, 1, 10)
    epoch(4)
    epoch(5)
    feed.poll()
    assert not feed.migrated()
    handle.step_committed(6, 1, 10)
    epoch(6)
    epoch(7)
    feed.poll()
    feed.poll()
    assert feed.migrated()
    assert [(r["epoch"], r["phase"]) for r in feed.rows] == [
        (1, "steady"), (2, "steady"), (3, "steady"), (4, "migrating"), (5, "migrating"),
        (6, "migrating"), (7, "after")]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 7
    assert lines[3].startswith("epoch    4") and lines[3].endswith("[migrating]")
