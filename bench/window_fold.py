"""A window aggregate's epoch at one worker, in process: what NEXMark Q5 and Q7 cost a worker's
Python besides Spark and the store.

Feeds NEXMark bids (``--rate`` events per second, ``--interval`` seconds an epoch, the share of
one of ``--workers`` workers by auction) epoch after epoch through ``WindowAggregate``'s
columnar fold as a worker runs it: the keys' states decoded from msgpack, the due timers fired
and the records folded (``process_epoch``), the new states encoded, the outputs made an Arrow
table. State and timers carry over from epoch to epoch as the store would keep them. Prints the
median milliseconds per epoch over the epochs after ``--warmup``, of the whole and of each
part, and the size of the states at the end; ``--json`` also writes them.

    python bench/window_fold.py --query q5 --rate 50000
    python bench/window_fold.py --query q7 --rate 100000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from megaphone.nexmark import definitions as D
from megaphone.nexmark.generator import NexmarkConfig, generate
from megaphone.operators import Context, WindowAggregate
from megaphone.operators.process import EpochBatch, run_epoch, watermark
from megaphone.operators.window_state import open_windows

#: Per query: the window aggregate of its first stage.
QUERIES = {
    "q5": lambda: WindowAggregate(size_us=D.Q5_SIZE_US, slide_us=D.Q5_SLIDE_US, agg="count"),
    "q7": lambda: WindowAggregate(size_us=D.Q7_SIZE_US, agg="max"),
}
PARTS = ("decode", "fold", "encode", "outputs")


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--query", choices=sorted(QUERIES), default="q5")
    p.add_argument("--rate", type=float, default=50_000, help="events per second")
    p.add_argument("--interval", type=float, default=2.0, help="seconds of events per epoch")
    p.add_argument("--workers", type=int, default=2, help="this worker's share is 1/workers")
    p.add_argument("--epochs", type=int, default=20, help="epochs measured")
    p.add_argument("--warmup", type=int, default=8, help="epochs run first, not measured")
    p.add_argument("--json", type=Path, help="also write the medians here")
    return p


def main(argv: list[str] | None = None) -> None:
    """Run the epochs and print the medians."""
    args = parser().parse_args(argv)
    fn = QUERIES[args.query]()
    config = NexmarkConfig(events_per_second=args.rate)
    per_epoch = int(args.rate * args.interval)
    states: dict[int, bytes] = {}
    timers: dict[int, set[int]] = {}
    high: int | None = None
    times: dict[str, list[float]] = {part: [] for part in (*PARTS, "epoch")}
    for epoch in range(args.warmup + args.epochs):
        bids = generate(config, epoch * per_epoch, per_epoch).bids
        mine = pa.array(bids.column("auction").to_numpy() % args.workers == 0)
        bids = bids.filter(mine)
        wm = watermark(high, fn.lateness_us)
        due = {k: sorted(t for t in ts if wm is not None and t <= wm) for k, ts in timers.items()}
        keys = list(dict.fromkeys([k for k, ts in due.items() if ts] +
                                  bids.column("auction").to_pylist()))
        slot = {k: i for i, k in enumerate(keys)}
        pairs = [(slot[k], t) for k, ts in due.items() for t in ts]
        event_times = bids.column("date_time").cast(pa.timestamp("us", "UTC")) \
            .cast(pa.int64()).to_numpy()
        batch = EpochBatch(keys, np.array([s for s, _ in pairs], np.int64),
                           np.array([t for _, t in pairs], np.int64),
                           np.array([slot[k] for k in bids.column("auction").to_pylist()],
                                    np.int64), event_times,
                           None if fn.agg == "count" else bids.column("price").combine_chunks())
        raw = [states.get(k) for k in keys]
        t0 = time.perf_counter()
        decoded = [None if r is None else msgpack.unpackb(r, strict_map_key=False) for r in raw]
        t1 = time.perf_counter()
        result = run_epoch(fn, batch, decoded, Context(epoch, wm))
        t2 = time.perf_counter()
        packb = msgpack.Packer().pack
        encoded = [None if s is None else packb(s) for s in result.states]
        t3 = time.perf_counter()
        pa.table({"key": pa.array(result.out_keys, pa.int64()),
                  "output": pa.array(result.out_values, fn.output_type(pa.int64()))})
        t4 = time.perf_counter()
        for part, seconds in zip((*PARTS, "epoch"), (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0),
                                 strict=True):
            if epoch >= args.warmup:
                times[part].append(seconds * 1000)
        for k, state, fired, added in zip(keys, encoded, result.fired, result.set, strict=True):
            if state is None:
                states.pop(k, None)
            else:
                states[k] = state
            timers[k] = (timers.get(k, set()) - set(fired)) | added
        top = int(event_times.max()) if len(event_times) else None
        high = top if high is None or (top is not None and top > high) else high
    medians = {part: round(statistics.median(ms), 1) for part, ms in times.items()}
    state_bytes = statistics.mean(map(len, states.values())) if states else 0.0
    windows = sum(len(open_windows(msgpack.unpackb(v, strict_map_key=False)))
                  for v in states.values())
    print(f"{args.query} at {args.rate:,.0f} events/s, one of {args.workers} workers, "
          f"{len(states):,} keys with open windows ({windows:,} windows, "
          f"{state_bytes:.1f} bytes a key's state); median ms per epoch:")
    for part, ms in medians.items():
        print(f"  {part:8s} {ms:8.1f}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "median_ms": medians, "keys": len(states),
                                         "windows": windows, "state_bytes": state_bytes},
                                        indent=1))


if __name__ == "__main__":
    main()
