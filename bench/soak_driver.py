"""The soak's driver process: one run of the application that ``bench/soak.py`` kills and starts.

It opens the pipeline (a keyed count with a synthetic per-record cost, the DS2 scenario's cost
model) from its state directory and checkpoint location, starts it on Structured Streaming over
the Parquet files the soak writes, and follows the soak's :class:`Schedule`: in every slot one
action, a live migration back and forth (fluid, batched, all-at-once, deadline) or a slot of
DS2 autoscaling while the input rate steps up and down. It appends one JSON line per epoch to
``epochs.jsonl``, one per action to ``actions.jsonl`` and one per start-up phase to
``phases.jsonl`` (the soak breaks a driver kill's recovery down by them). A driver killed
mid-run is started again by the soak; plans in flight continue from the pipeline's commit
record.

When ``finish`` appears in the run directory it stops submitting, waits for the stream to go
idle, stops the stream and writes the final state (``final.parquet``:
key, count) for the soak to check against what it fed.

    python bench/soak_driver.py RUN_DIR    # started by bench/soak.py, not by hand
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: When this process got this far (before PySpark's import): a driver restart's first phase.
LOADED = time.time()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

#: The migration actions, one per slot, in this order (then again).
ACTIONS = ("fluid", "batched", "all-at-once", "deadline", "ds2")


@dataclass(frozen=True)
class Schedule:
    """What happens when, as a function of the wall clock; the writer and the driver share it.

    After ``warmup_s`` the run is cut into slots of ``slot_s`` seconds; slot ``i`` does
    ``ACTIONS[i % 5]``. A ``ds2`` slot feeds ``high`` times the base ``rate`` for its first
    half. Kills come every ``kill_every_s / 2`` seconds from ``warmup_s + kill_every_s / 4``,
    the driver and an executor in turn, none in the last ``kill_margin_s`` of the run.
    """

    t0: float
    seconds: float
    warmup_s: float
    slot_s: float
    rate: float
    high: float
    kill_every_s: float
    kill_margin_s: float

    def slot(self, now: float) -> int:
        """The slot at wall time ``now`` (negative during the warm-up)."""
        elapsed = now - self.t0 - self.warmup_s
        return -1 if elapsed < 0 else int(elapsed // self.slot_s)

    def action(self, slot: int) -> str | None:
        """The action of ``slot`` (``None`` during the warm-up)."""
        return None if slot < 0 else ACTIONS[slot % len(ACTIONS)]

    def rate_at(self, now: float) -> float:
        """Records per second the writer feeds at ``now``."""
        slot = self.slot(now)
        into = now - self.t0 - self.warmup_s - slot * self.slot_s
        high = self.action(slot) == "ds2" and into < self.slot_s / 2
        return self.rate * (self.high if high else 1.0)

    def kills(self) -> list[tuple[float, str]]:
        """``(seconds after t0, "driver" | "executor")`` of every kill, in order."""
        step = self.kill_every_s / 2
        out, t, i = [], self.warmup_s + self.kill_every_s / 4, 0
        while t < self.seconds - self.kill_margin_s:
            out.append((t, "driver" if i % 2 == 0 else "executor"))
            t, i = t + step, i + 1
        return out


def append_line(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON line (flushed: the process may be killed at any moment)."""
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path``; a last line cut short by a kill is skipped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class Driver:
    """One driver process: the pipeline, its stream, and the schedule's actions."""

    def __init__(self, run: Path) -> None:
        from bench.ds2_scenario import slow_count
        from megaphone.migrator.pipeline.facade import Pipeline
        from megaphone.spark import check_python_workers, spark_session

        self.run = run
        self.pid = os.getpid()
        self.phase("process", LOADED)
        self.cfg = json.loads((run / "config.json").read_text())
        self._schedule: Schedule | None = None
        self.spark = spark_session(self.cfg["master"], "megaphone-soak", self.cfg["conf"])
        self.phase("session")
        threading.Thread(target=self._watch_executors, daemon=True).start()
        self.workers = int(self.cfg["workers"])
        self.pipe = Pipeline(
            self.spark, self.cfg["state_dir"], key="k", update=slow_count(self.cfg["cost_s"]),
            workers=self.workers, num_bins=self.cfg["bins"], key_type="int64", event_time="t",
            local_dir=self.cfg["local_dir"], checkpoint=self.cfg["checkpoint"])
        self.phase("pipeline")
        check_python_workers(self.spark)  # what the first epoch would do first: timed apart
        self.phase("workers")
        self.controller: Any = None
        self._ds2_logged = 0
        done = {a["slot"] for a in read_lines(run / "actions.jsonl")}
        if self.pipe.in_flight and self.schedule is not None:  # submitted just before a kill
            done.add(self.schedule.slot(time.time()))
        self.done_slots = done

    def phase(self, name: str, when: float | None = None) -> None:
        """Record that this driver reached start-up phase ``name`` (``phases.jsonl``): the soak
        breaks a driver kill's recovery down by them."""
        append_line(self.run / "phases.jsonl", {"pid": self.pid, "phase": name,
                                                "time": time.time() if when is None else when})

    def _watch_executors(self, timeout: float = 600) -> None:
        """Record the ``executors`` phase once the cluster's executors have registered."""
        want, deadline = int(self.cfg.get("executors", 0)), time.time() + timeout
        tracker = self.spark.sparkContext.statusTracker()
        while want and len(tracker.getExecutorInfos()) - 1 < want and time.time() < deadline:
            time.sleep(0.2)
        self.phase("executors")

    @property
    def schedule(self) -> Schedule | None:
        """The soak's schedule, once the soak has written it (after the first driver started
        its stream, so that driver start-up is not part of the run)."""
        path = self.run / "schedule.json"
        if self._schedule is None and path.exists():
            self._schedule = Schedule(**json.loads(path.read_text()))
        return self._schedule

    def start(self) -> Any:
        """Start the stream over the input directory (one epoch per trigger)."""
        stream = (self.spark.readStream.schema("k long, t timestamp")
                  .option("maxFilesPerTrigger", self.cfg["max_files_per_trigger"])
                  .option("cleanSource", "delete").parquet(self.cfg["input_dir"]))
        return self.pipe.start(stream, self.sink, trigger={"processingTime": "1 second"},
                               checkpoint_location=self.cfg.get("stream_checkpoint"))

    def sink(self, outputs: Any, epoch: int) -> None:
        """Record the epoch (the outputs themselves are not needed: the state is checked)."""
        m = self.pipe.metrics(last=1)[0]
        restores = [w["restored"] for w in m["per_worker"].values() if w.get("restored")]
        append_line(self.run / "epochs.jsonl", {
            "time": time.time(), "epoch": epoch, "pid": self.pid,
            "records_in": m["records_in"], "latency_s": m["latency_s"],
            "duration_s": m["duration_s"], "workers": m["workers"],
            "bins_moved": m["bins_moved"], "bytes_moved": m["bytes_moved"],
            "in_flight": len(self.pipe.in_flight), "job_attempts": m["job_attempts"],
            "restored": len(restores),
            "restore_s": max((r.get("seconds", 0.0) for r in restores), default=0.0),
            "started": m["started"], "phases_s": m["phases_s"], "away": m["away"],
            "begin_s": max((w.get("begin_s") or 0.0 for w in m["per_worker"].values()),
                           default=0.0),
            "unreachable": sum(1 for w in m["per_worker"].values() if w.get("home_unreachable")),
            "replayed": any(w.get("replayed") for w in m["per_worker"].values())})

    def step(self) -> None:
        """Act on the schedule once: start this slot's action when nothing is in flight."""
        schedule = self.schedule
        if schedule is None:
            return
        now = time.time()
        slot = schedule.slot(now)
        action = schedule.action(slot)
        self._log_ds2_plans()
        if self.controller is not None and action != "ds2":
            self.controller.stop()
            self.controller = None
        if action == "ds2" and self.controller is None and slot in self.done_slots:
            self.controller = self._autoscale()  # a restarted driver resumes the DS2 slot
        if action is None or slot in self.done_slots or self.pipe.in_flight:
            return
        current = len(self.pipe.routing.workers())
        if action == "ds2":
            self.controller = self._autoscale()
            target = None
        else:
            target = 2 * self.workers if current <= self.workers else self.workers
            self.pipe.migrate(self._plan(action, target))
        self.done_slots.add(slot)
        append_line(self.run / "actions.jsonl", {
            "time": now, "slot": slot, "action": action, "from": current, "to": target,
            "pid": self.pid})

    def _log_ds2_plans(self) -> None:
        """Record the rescales the DS2 controller submitted since the last call."""
        if self.controller is None:
            return
        for handle in self.controller.handles[self._ds2_logged:]:
            append_line(self.run / "actions.jsonl", {
                "time": time.time(), "slot": -1, "action": "ds2-rescale",
                "from": len(self.pipe.routing.workers()),
                "to": None, "bins": handle.progress.bins_total, "pid": self.pid})
        self._ds2_logged = len(self.controller.handles)

    def _plan(self, action: str, workers: int) -> Any:
        import megaphone

        return megaphone.rescale(self.pipe, workers=workers, strategy=action,
                                 per_worker=self.cfg["per_worker"],
                                 target_latency=self.cfg["target_latency"]
                                 if action == "deadline" else None)

    def _autoscale(self) -> Any:
        from megaphone.plans.autoscale import Policy

        policy = Policy(interval_s=self.cfg["ds2_interval_s"], activation=2,
                        min_workers=self.workers, max_workers=2 * self.workers,
                        strategy="batched", per_worker=self.cfg["per_worker"],
                        ignore_down_by_one=False)
        self._ds2_logged = 0
        return self.pipe.autoscale(policy)

    def finish(self, query: Any, idle_triggers: int = 3, timeout: float = 600) -> None:
        """Drain: no new actions, the stream idle (every file applied); then the state. A plan
        still in flight stays in flight: the state is read from each bin's owner."""
        if self.controller is not None:
            self.controller.stop()
        deadline = time.time() + timeout
        while not _idle(query, idle_triggers) and time.time() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"the stream failed: {query.exception()}")
            time.sleep(1)
        self.pipe.stop()
        import pyarrow as pa
        import pyarrow.parquet as pq

        from megaphone.state_backends import unpack_value

        state = self.pipe.state().toPandas()  # (key, msgpack state): a general update
        pq.write_table(pa.table({
            "k": pa.array(state.iloc[:, 0], pa.int64()),
            "count": pa.array([unpack_value(v) for v in state.iloc[:, 1]], pa.int64())}),
            self.run / "final.parquet")
        append_line(self.run / "actions.jsonl", {
            "time": time.time(), "slot": -1, "action": "finish", "from": None, "to": None,
            "pid": self.pid, "in_flight": len(self.pipe.in_flight)})


def _idle(query: Any, triggers: int) -> bool:
    """Whether the last ``triggers`` triggers of ``query`` found no new input."""
    recent = query.recentProgress[-triggers:]
    return len(recent) == triggers and all(p["numInputRows"] == 0 for p in recent)


def main(argv: list[str] | None = None) -> int:
    """Run the driver until ``finish`` appears in the run directory, or until it is killed."""
    run = Path((argv if argv is not None else sys.argv[1:])[0])
    driver = Driver(run)
    query = driver.start()
    driver.phase("stream")
    append_line(run / "actions.jsonl", {"time": time.time(), "slot": -1, "action": "start",
                                        "from": None, "to": None, "pid": driver.pid})
    while not (run / "finish").exists():
        if query.exception() is not None:
            raise RuntimeError(f"the stream failed: {query.exception()}")
        driver.step()
        time.sleep(0.5)
    driver.finish(query)
    driver.pipe.close()
    driver.spark.stop()
    return 0


__all__ = ["ACTIONS", "Schedule", "append_line", "read_lines"]

if __name__ == "__main__":
    sys.exit(main())
