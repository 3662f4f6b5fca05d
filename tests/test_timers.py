"""Event-time timers stored as raw keys in their bin: encoding, due scans, and that they travel
with the bin (commit, durable copy, export/import, bin files, the store service) while every
reader of plain keys skips them."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megaphone.routing.bins import MAX_NUM_BINS
from megaphone.state_backends import (
    BACKENDS,
    TIMER_MARK,
    StateBackend,
    decode_timer_keys,
    encode_keys,
    encode_timer_keys,
    is_timer_key,
    open_backend,
    pack_value,
    timer_range,
)
from megaphone.state_backends.bin_files import transfer_dir
from megaphone.state_backends.durable import DurableCopy
from megaphone.state_backends.encoding import bin_prefix, bins_of_raw
from megaphone.state_backends.remote import RemoteStore
from megaphone.state_backends.timer_keys import MAX_TIME, MIN_TIME, timer_mask
from megaphone.state_backends.worker_store import WorkerStore

BINS = 8
INT64 = st.integers(MIN_TIME, MAX_TIME)
#: int64 keys whose 8 encoded bytes start with 0xFE, like a timer's mark.
FE_KEYS = [0x7E00_0000_0000_0000, 0x7E00_0000_0000_0001, 0x7EFF_FFFF_FFFF_FFFF]
FE_TIMES = st.sampled_from([MIN_TIME, -1, 0, 1, 5, MAX_TIME - 1, MAX_TIME])


def open_new(kind: str, tmp_path: Path, key_type: str = "int64") -> StateBackend:
    """A brand-new backend of ``kind`` in a directory of its own (one per hypothesis example:
    ``tmp_path`` is shared by the examples)."""
    return open_backend(kind, os.path.join(tempfile.mkdtemp(dir=tmp_path), "db"), key_type, BINS)


def put_timers(be: StateBackend, timers: list[tuple[int, int, object]], key_type: str = "int64"
               ) -> list[bytes]:
    """Write timers ``(bin, time, key)`` (empty values); their raw keys."""
    if not timers:
        return []
    bins, times, keys = zip(*timers, strict=True)
    raw = encode_timer_keys(list(bins), list(times), list(keys), key_type)
    be.write_raw(raw, [b""] * len(raw))
    return raw


def expected_due(raw: list[bytes], bins: list[int], upto: int, key_type: str) -> list[bytes]:
    """The model: timers of ``bins`` (given order, repeats once) with time <= upto, key order."""
    out: list[bytes] = []
    b, t, _ = decode_timer_keys(raw, key_type)
    for want in dict.fromkeys(bins):
        out += sorted({r for r, rb, rt in zip(raw, b.tolist(), t.tolist(), strict=True)
                       if rb == want and rt <= upto})
    return out


# ----------------------------------------------------------------------------- encoding


@given(st.lists(st.tuples(st.integers(0, MAX_NUM_BINS - 1), INT64,
                          st.one_of(st.none(), INT64, st.sampled_from(FE_KEYS))), max_size=40))
def test_int64_timer_keys_round_trip(timers):
    bins, times, keys = (list(c) for c in zip(*timers, strict=True)) if timers else ([], [], [])
    raw = encode_timer_keys(bins, times, keys, "int64")
    assert all(is_timer_key(r) and r[4:5] == TIMER_MARK for r in raw)
    b, t, k = decode_timer_keys(raw, "int64")
    assert (b.tolist(), t.tolist(), k) == (bins, times, keys)
    assert bins_of_raw(raw).tolist() == bins  # a timer belongs to its bin
    assert timer_mask(pa.array(raw, pa.binary())).all()


@given(st.lists(st.tuples(st.integers(0, MAX_NUM_BINS - 1), INT64,
                          st.one_of(st.none(), st.text(max_size=8))), max_size=40))
def test_str_timer_keys_round_trip(timers):
    bins, times, keys = (list(c) for c in zip(*timers, strict=True)) if timers else ([], [], [])
    raw = encode_timer_keys(np.array(bins, np.int64), np.array(times, np.int64), keys, "str")
    assert all(is_timer_key(r) for r in raw)
    b, t, k = decode_timer_keys(raw, "str")
    assert (b.tolist(), t.tolist(), k) == (bins, times, keys)


@given(st.lists(st.tuples(INT64, INT64), max_size=40), st.lists(st.tuples(INT64, st.text()),
                                                                max_size=40))
def test_timers_of_a_bin_sort_by_time_then_key(int_timers, str_timers):
    for key_type, timers in (("int64", int_timers), ("str", str_timers)):
        raw = encode_timer_keys([3] * len(timers), [t for t, _ in timers],
                                [k for _, k in timers], key_type)
        assert sorted(raw) == [r for _, r in sorted(zip(timers, raw, strict=True))]
        assert all(bin_prefix(3) + TIMER_MARK <= r < bin_prefix(4) for r in raw)


def test_plain_keys_are_never_timers():
    plain = encode_keys([1] * 5, [*FE_KEYS, -1, None], "int64")
    assert [r[4] for r in plain[:3]] == [0xFE] * 3  # inside the timer range's first byte ...
    assert not any(map(is_timer_key, plain))  # ... but 12 bytes long: no timer
    assert not timer_mask(pa.array(plain, pa.binary())).any()
    strs = encode_keys([1] * 4, ["", "a", "\u00fe\U0001f600", None], "str")
    assert not any(map(is_timer_key, strs)) and not timer_mask(pa.array(strs)).any()
    with pytest.raises(ValueError, match="not a timer key"):
        decode_timer_keys(plain[:1], "int64")


def test_timer_range_bounds_are_inclusive_and_safe_at_the_extremes():
    for upto in (MIN_TIME, -1, 0, MAX_TIME - 1, MAX_TIME):
        begin, end = timer_range(5, upto)
        for t in {t for t in (MIN_TIME, upto - 1, upto, upto + 1, MAX_TIME)
                  if MIN_TIME <= t <= MAX_TIME}:
            for key in (None, MIN_TIME, 0, MAX_TIME):
                (r,) = encode_timer_keys([5], [t], [key], "int64")
                assert (begin <= r < end) == (t <= upto)
            (s,) = encode_timer_keys([5], [t], [""], "str")  # the shortest timer key
            assert (begin <= s < end) == (t <= upto)
    assert timer_range(5, MAX_TIME)[1] <= encode_keys([5], [None], "int64")[0]
    with pytest.raises(OverflowError):
        timer_range(5, MAX_TIME + 1)
    with pytest.raises(TypeError):
        encode_timer_keys([1], [1.5], [1], "int64")
    with pytest.raises(ValueError, match="times"):
        encode_timer_keys([1, 2], [1], [1, 2], "int64")


# ----------------------------------------------------------------------------- due_timers


timers_st = st.lists(st.tuples(st.integers(0, BINS - 1), FE_TIMES | INT64,
                               st.one_of(st.none(), st.sampled_from(FE_KEYS),
                                         st.integers(-50, 50))), max_size=30)
plain_st = st.dictionaries(st.tuples(st.integers(0, BINS - 1),
                                     st.one_of(st.none(), st.sampled_from(FE_KEYS),
                                               st.integers(-50, 50))),
                           st.integers(0, 9), max_size=30)


@pytest.mark.parametrize("kind", BACKENDS)
@settings(max_examples=25)
@given(timers=timers_st, plain=plain_st, bins=st.lists(st.integers(0, BINS - 1), max_size=10),
       upto=FE_TIMES | INT64)
def test_due_timers_equal_the_model(tmp_path, kind, timers, plain, bins, upto):
    be = open_new(kind, tmp_path)
    try:
        if plain:
            be.put_many([b for b, _ in plain], [k for _, k in plain], list(plain.values()))
        raw = put_timers(be, timers)
        assert be.due_timers(bins, upto) == expected_due(raw, bins, upto, "int64")
        assert be.due_timers(range(BINS), MAX_TIME) == sorted(set(raw))
        # plain keys, 0xFE-led int64 keys among them, read back whole and alone
        assert {(b, k): v for b, k, v in be.items()} == plain
        assert be.get_many([b for b, _ in plain], [k for _, k in plain]) == \
            list(plain.values())
        assert be.bin_stats() == be.scan_bin_stats()  # timers count as keys of their bin
    finally:
        be.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_due_timers_of_str_keys_and_bad_arguments(tmp_path, kind):
    be = open_new(kind, tmp_path, "str")
    try:
        be.put_many([1, 1, 2], ["a", "", None], [1, 2, 3])
        raw = put_timers(be, [(1, 10, "b"), (1, 10, "a"), (1, -3, None), (2, 11, ""),
                              (1, 11, "a")], "str")
        assert be.due_timers([2, 1], 10) == [raw[2], raw[1], raw[0]]
        assert be.due_timers([1, 2, 1], 11) == [raw[2], raw[1], raw[0], raw[4], raw[3]]
        assert be.due_timers([], 11) == [] and be.due_timers([3], MAX_TIME) == []
        assert sorted(be.items()) == sorted([(1, "a", 1), (1, "", 2), (2, None, 3)])
        with pytest.raises(ValueError, match="bin ids"):
            be.due_timers([BINS], 0)
        with pytest.raises(OverflowError):
            be.due_timers([1], MAX_TIME + 1)
    finally:
        be.close()


def test_the_memory_backend_finds_its_timers_after_a_reopen(tmp_path):
    be = open_backend("memory", tmp_path / "m", "int64", BINS)
    raw = put_timers(be, [(1, 5, 1), (1, 6, FE_KEYS[0]), (2, 7, None)])
    be.write_raw([raw[1]], [None])  # a fired timer is deleted
    be.put_many([1], [FE_KEYS[1]], ["plain"])
    be.close()
    again = open_backend("memory", tmp_path / "m", "int64", BINS, read_only=True)
    assert again.due_timers([1, 2], MAX_TIME) == [raw[0], raw[2]]
    assert list(again.items()) == [(1, FE_KEYS[1], "plain")]
    again.close()


# ----------------------------------------------------------------------------- readers


def test_the_state_reader_leaves_timer_keys_out():
    from megaphone.state_backends.kv_batches import state_rows

    for key_type, keys, arrow in (("int64", [*FE_KEYS, None], pa.int64()),
                                  ("str", ["a", "", None], pa.string())):
        plain = encode_keys([1] * len(keys), keys, key_type)
        timers = encode_timer_keys([1] * len(keys), [5] * len(keys), keys, key_type)
        k = pa.array(sorted(plain + timers), pa.binary())
        v = pa.array([b"" if is_timer_key(r) else pack_value(7) for r in k.to_pylist()],
                     pa.binary())
        schema = pa.schema([("key", arrow), ("state", pa.int64())])
        got = state_rows(schema, key_type, k, v, decoded=True).to_pylist()
        assert sorted(got, key=repr) == sorted(({"key": x, "state": 7} for x in keys), key=repr)


# ----------------------------------------------------------------------------- travel


def commit_epochs(store: WorkerStore, epochs: list[tuple[list[bytes], list[bytes | None]]]
                  ) -> None:
    """Commit each epoch's raw writes (``None`` deletes) as a worker does."""
    for epoch, (keys, values) in enumerate(epochs):
        assert store.check_can_apply(epoch)
        store.commit(epoch, keys, values, store.read(keys), b"", [])


@pytest.mark.parametrize("kind", BACKENDS)
def test_committed_timers_and_their_deletes_restore_from_the_durable_copy(tmp_path, kind):
    ckpt = str(tmp_path / "ckpt")
    t = encode_timer_keys([1, 1, 2, 3], [10, 20, 10, MIN_TIME], [7, FE_KEYS[1], None, 7],
                          "int64")
    p = encode_keys([1, 1], [7, FE_KEYS[1]], "int64")
    epochs = [([*t[:3], p[0]], [b"", b"", b"", pack_value(1)]),
              ([t[0], t[3], p[1]], [None, b"", pack_value(2)]),  # timer 0 fired: deleted
              ([t[2], t[0]], [None, b""])]  # one fired, one set again
    with WorkerStore.open(kind, tmp_path / "live", "int64", BINS,
                          durable=DurableCopy(ckpt, 0, 2)) as live:
        commit_epochs(live, epochs)
        want = dict(live.backend.raw_items())
        assert live.due_timers([1, 2, 3], 15) == [t[0], t[3]]
        assert live.due_timers([3, 2, 1], MAX_TIME) == [t[3], t[0], t[1]]
        token = live.token
    with WorkerStore.open(kind, tmp_path / "restored", "int64", BINS,
                          durable=DurableCopy(ckpt, 0, 2)) as fresh:
        fresh.restore(2, token)
        assert dict(fresh.backend.raw_items()) == want
        assert fresh.due_timers([3, 2, 1], MAX_TIME) == [t[3], t[0], t[1]]
        assert sorted(fresh.backend.items()) == [(1, 7, 1), (1, FE_KEYS[1], 2)]
        assert fresh.backend.bin_stats() == fresh.backend.scan_bin_stats()


def filled(kind: str, path: Path) -> tuple[StateBackend, list[bytes]]:
    """A store with plain keys (0xFE-led ones too) and timers in bins 2 and 3."""
    be = open_backend(kind, path, "int64", BINS)
    be.put_many([2, 2, 2, 3], [FE_KEYS[0], FE_KEYS[2], -4, None], [1, 2, 3, 4])
    raw = put_timers(be, [(2, t, k) for t in (MIN_TIME, 0, 9) for k in (None, 1, FE_KEYS[1])]
                     + [(3, 1, 1)])
    return be, raw


@pytest.mark.parametrize("source", BACKENDS)
@pytest.mark.parametrize("dest", BACKENDS)
@pytest.mark.parametrize("method", ["chunk", "sst"])
def test_an_exported_bin_carries_its_timers(tmp_path, source, dest, method):
    src, raw = filled(source, tmp_path / "src")
    dst = open_backend(dest, tmp_path / "dst", "int64", BINS)
    try:
        dst.import_bins(src.export_bins([2], chunk_bytes=64), method=method)
        assert dst.due_timers([2, 3], MAX_TIME) == src.due_timers([2], MAX_TIME)
        assert dst.due_timers([2], 0) == sorted(raw[:6])
        assert sorted(dst.items()) == sorted(x for x in src.items() if x[0] == 2)
        assert dst.bin_stats() == {2: src.bin_stats()[2]} and \
            dst.bin_stats() == dst.scan_bin_stats()
        src.drop_bins([2])
        assert src.due_timers([2, 3], MAX_TIME) == [raw[-1]]
    finally:
        src.close()
        dst.close()


def test_a_bin_shipped_as_a_file_carries_its_timers(tmp_path):
    src, raw = filled("rocksdb", tmp_path / "src")
    dst = open_backend("rocksdb", tmp_path / "dst", "int64", BINS)
    try:
        made = src.write_bin_file(2)
        assert made is not None and made.keys == src.bin_stats()[2].keys
        inbox = transfer_dir(str(tmp_path / "dst"), "in")
        os.makedirs(inbox)
        moved = os.path.join(inbox, os.path.basename(made.path))
        os.replace(made.path, moved)
        dst.ingest_bin_files([dataclasses.replace(made, path=moved)])
        assert dst.due_timers([2], MAX_TIME) == src.due_timers([2], MAX_TIME) == sorted(raw[:9])
        assert sorted(dst.items()) == sorted(x for x in src.items() if x[0] == 2)
        assert dst.bin_stats() == dst.scan_bin_stats()
    finally:
        src.close()
        dst.close()


# ----------------------------------------------------------------------------- the service


def test_due_timers_through_the_store_service(tmp_path, local):
    store = RemoteStore(local, str(tmp_path / "w"), "rocksdb", "str", BINS, 0)
    assert store.begin(0) == (True, b"")
    t = encode_timer_keys([4, 4, 5], [3, -3, 0], ["k", None, "k"], "str")
    p = encode_keys([4], ["k"], "str")
    store.commit(0, [*t, *p], [b"", b"", b"", pack_value("v")], [None] * 4, b"", [])
    assert store.due_timers([5, 4], 0) == [t[2], t[1]]
    assert store.due_timers(np.array([4, 5]), MAX_TIME) == [t[1], t[0], t[2]]
    assert store.due_timers([], 0) == []
    store.begin(1)
    store.commit(1, [t[1]], [None], [b""], b"", [])  # fired
    assert store.due_timers([4], MAX_TIME) == [t[0]]
    bins, times, keys = decode_timer_keys(store.due_timers([4, 5], MAX_TIME), "str")
    assert (bins.tolist(), times.tolist(), keys) == ([4, 5], [3, 0], ["k", "k"])


# ----------------------------------------------------------------------------- timer groups

class _Store:
    """What ``process_step`` asks of a store, over a memory backend."""

    def __init__(self, backend: StateBackend) -> None:
        self.backend = backend
        self.read = backend.get_raw
        self.due_timers = backend.due_timers


def _due_and_write(store: _Store, key_type: str, epoch: int, upto: int,
                   setting: list[tuple[object, int]]) -> set[tuple[int, int, object]]:
    """One epoch's timers as ``process_step`` runs them: the due rows read and expanded, then
    every due timer fired and ``setting`` ``(key, time)`` set, written as groups; the fired
    ``(bin, time, key)``."""
    from megaphone.migrator.task.process_step import _timer_writes
    from megaphone.state_backends.timer_keys import expand_due

    rows = store.due_timers(range(BINS), upto)
    row_values = store.read(rows)
    due = expand_due(rows, row_values)
    assert len(set(due)) == len(due)  # each timer once
    bins_, times, keys = decode_timer_keys(due, key_type)
    pairs = list(zip(bins_.tolist(), times.tolist(), strict=True))
    assert pairs == sorted(pairs)  # the bins given in order, a bin's by time
    fired = set(zip(bins_.tolist(), times.tolist(), keys, strict=True))
    slot_keys = list(dict.fromkeys([k for _, _, k in fired] + [k for k, _ in setting]))
    slot_bins = np.array([hash(k) % BINS for k in slot_keys], np.int64)  # any fixed bin
    state_keys = encode_keys(slot_bins, slot_keys, key_type)
    slot = {k: i for i, k in enumerate(slot_keys)}
    new_slots = np.array([slot[k] for k, _ in setting], np.int64)
    new_times = np.array([t for _, t in setting], np.int64)
    keys_, values, olds = _timer_writes(store, epoch, slot_bins, state_keys, rows, row_values,
                                        new_slots, new_times)
    assert olds == store.read(keys_)  # the undo record's old values are the stored ones
    store.backend.write_raw(keys_, values)
    return fired


@settings(max_examples=100, deadline=None)
@given(legacy=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 30)), max_size=12),
       epochs=st.lists(st.tuples(st.integers(0, 8), st.lists(
           st.tuples(st.integers(0, 5) | st.none(), st.integers(0, 40)), max_size=10)),
           max_size=8),
       key_type=st.sampled_from(["int64", "str"]))
def test_timer_groups_fire_each_timer_once_as_the_model(tmp_path, legacy, epochs, key_type):
    """Timers written as groups (a row per bin, time and epoch), over a store that also holds
    per-key timers of an older version, fire exactly as a set of pending timers: each once,
    at the first watermark at or past its time, however many epochs set it; none lost, none
    doubled."""
    as_key = (lambda k: k) if key_type == "int64" else (lambda k: None if k is None else f"k{k}")
    with open_new("memory", tmp_path, key_type) as be:
        store = _Store(be)
        bin_of = {}
        pending: set[tuple[object, int]] = set()
        for k, t in legacy:  # per-key timer rows of an older store
            key = as_key(k)
            bin_of[key] = hash(key) % BINS
            be.write_raw(encode_timer_keys([bin_of[key]], [t], [key], key_type), [b""])
            pending.add((key, t))
        watermark = 0
        for epoch, (step, setting) in enumerate(epochs):
            watermark += step
            setting = [(as_key(k), t) for k, t in setting]
            for key, _ in setting:
                bin_of[key] = hash(key) % BINS
            fired = _due_and_write(store, key_type, epoch, watermark, setting)
            due = {(key, t) for key, t in pending if t <= watermark}
            assert fired == {(bin_of[k], t, k) for k, t in due}
            pending = (pending - due) | set(setting)
        left = _due_and_write(store, key_type, len(epochs), MAX_TIME, [])
        assert left == {(bin_of[k], t, k) for k, t in pending}
        assert be.due_timers(range(BINS), MAX_TIME) == []  # every row gone once fired


def test_timer_group_rows_are_timers_of_their_bin_and_refuse_bad_values():
    from megaphone.state_backends.timer_keys import (
        group_members,
        group_writes,
        is_timer_group,
        pack_group,
    )

    keys, values = group_writes(np.array([3, 1, 3, 3]), np.array([7, 7, 5, 5]),
                                [b"a", b"b", b"c", b"a"], 9)
    assert [group_members(v) for v in values] == [[b"b"], [b"a", b"c"], [b"a"]]  # bin, time
    assert keys == sorted(keys) and all(map(is_timer_group, keys))
    assert all(map(is_timer_key, keys)) and bins_of_raw(keys).tolist() == [1, 3, 3]
    assert timer_range(1, 7)[0] < keys[0] < timer_range(1, 7)[1] <= timer_range(1, 8)[1]
    per_key = encode_timer_keys([1, 1, 1], [7] * 3, ["", "\u00fe" * 4, None], "str") + \
        encode_timer_keys([1], [7], [-2], "int64")  # 0xFE-leading int64 bytes
    assert not any(map(is_timer_group, per_key))
    assert group_members(pack_group([b"z", b"a", b"z"])) == [b"a", b"z"]
    assert pack_group([]) is None and group_members(None) == []
    with pytest.raises(ValueError, match="timer group"):
        group_members(pack_value({"not": "a list"}))
