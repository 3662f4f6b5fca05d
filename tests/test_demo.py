"""The demo's input and its closing lines."""

from pyspark.sql import functions as F

from megaphone.demo import next_steps, words


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
