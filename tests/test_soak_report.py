"""The soak's account of driver kills, on made-up run files: where a recovery went, and which
worker restores count as outside the kills (the hour-long run itself: bench/RESULTS.md)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.soak_driver import Schedule, append_line, read_lines
from bench.soak_report import driver_recoveries, mark_replays, restores_outside_kills

SCHEDULE = Schedule(t0=0.0, seconds=1000.0, warmup_s=100.0, slot_s=100.0, rate=1.0, high=2.0,
                    kill_every_s=400.0, kill_margin_s=50.0)


def epoch(time: float, pid: int, restored: int = 0, **extra) -> dict:
    return {"time": time, "epoch": int(time), "pid": pid, "restored": restored,
            "duration_s": 1.0, "restore_s": 0.0, **extra}


def test_a_driver_kill_is_broken_down_into_its_phases(tmp_path: Path):
    for pid, phase, t in [(2, "process", 203.0), (2, "session", 230.0), (2, "executors", 232.0),
                          (2, "pipeline", 235.0), (2, "workers", 237.0),
                          (2, "stream", 240.0)]:
        append_line(tmp_path / "phases.jsonl", {"pid": pid, "phase": phase, "time": t})
    # epoch 205's line is a replay: its batch ran (and committed) before driver 2 existed
    for e in [epoch(190.0, 1), epoch(205.0, 2, started=199.5),
              epoch(250.0, 2, 2, duration_s=6.0, restore_s=1.5, started=244.0, begin_s=2.0,
                    phases_s={"job": 5.0}),
              epoch(260.0, 2)]:
        append_line(tmp_path / "epochs.jsonl", e)
    events = [{"time": 0.0, "event": "start", "pid": 1},
              {"time": 200.0, "event": "kill-driver", "pid": 1},
              {"time": 202.0, "event": "start", "pid": 2},
              {"time": 300.0, "event": "kill-executor", "pid": 9}]
    kills = [e for e in events if e["event"].startswith("kill")]
    result = {"run": tmp_path, "events": events, "schedule": SCHEDULE}
    epochs = sorted(read_lines(tmp_path / "epochs.jsonl"), key=lambda e: e["time"])
    phases = read_lines(tmp_path / "phases.jsonl")
    mark_replays(epochs, phases)
    # executor kills are not broken down
    [d] = driver_recoveries(result, epochs, phases, kills, [70.0, 5.0])
    assert d == {"at_s": 200.0, "restart_pause": 2.0, "interpreter": 1.0,
                 "pyspark_jvm_session": 27.0, "executors_after_session": 2.0,
                 "pipeline_open": 5.0, "workers_probe": 2.0, "stream_start": 3.0,
                 "to_first_epoch": 4.0,
                 "first_epoch_duration": 6.0, "first_epoch_restores": 2,
                 "first_epoch_restore_s": 1.5, "first_epoch_begin_s": 2.0,
                 "first_epoch_phases_s": {"job": 5.0}, "backlog": 20.0, "recovered": 70.0}
    json.dumps(d)  # it goes into summary.json


def test_restores_count_outside_the_kills_recoveries_even_when_one_outlasts_the_shadow():
    kills = [{"time": 200.0, "event": "kill-driver"}, {"time": 600.0, "event": "kill-driver"}]
    epochs = [epoch(50.0, 1, 3),            # warm-up: not counted
              epoch(330.0, 2, 2),           # 130 s after the kill, before it recovered (150 s)
              epoch(500.0, 2, 1),           # outside: counted
              epoch(990.0, 3, 4)]           # the second kill never recovered: inside
    out = restores_outside_kills(epochs, SCHEDULE, kills, [150.0, None])
    assert out == {"epochs": 1, "restores": 1, "ok": False}
    assert restores_outside_kills(epochs[:2], SCHEDULE, kills, [150.0, None])["ok"]
