"""Keyed state backends: encoding, round trips, migration primitives, counters, persistence."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import megaphone.state_backends.backend_base as backend_base
import megaphone.state_backends.sst_files as sst_files
from megaphone.routing.bins import MAX_NUM_BINS
from megaphone.routing.keys import KEY_ARROW_TYPES
from megaphone.state_backends import (
    BACKENDS,
    EXPORT_SCHEMA,
    META_PREFIX,
    BinStats,
    StateBackend,
    bin_range,
    decode_keys,
    encode_keys,
    meta_key,
    open_backend,
    open_checkpoint,
    pack_value,
    pack_values,
    unpack_value,
    unpack_values,
)
from megaphone.state_backends.encoding import (
    NULL_KEY,
    bin_prefix,
    bin_runs,
    bins_of_raw,
    decode_int_keys,
    unpack_ints,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=12)


def fresh_dir(tmp_path: Path) -> str:
    """A new empty directory per hypothesis example (tmp_path is shared across examples)."""
    return tempfile.mkdtemp(dir=tmp_path)


def open_new(kind: str, tmp_path: Path, key_type: str = "int64", num_bins: int = 16
             ) -> StateBackend:
    """A brand-new backend of ``kind`` in its own directory."""
    return open_backend(kind, os.path.join(fresh_dir(tmp_path), "db"), key_type, num_bins)


def raw_by_bin(be: StateBackend) -> dict[int, list[tuple[bytes, bytes]]]:
    """All raw entries grouped by bin, in key order (for byte-identical comparisons)."""
    out: dict[int, list[tuple[bytes, bytes]]] = {}
    for k, v in be.raw_items():
        out.setdefault(int.from_bytes(k[:4], "big"), []).append((k, v))
    return out


def assert_stats_exact(be: StateBackend) -> None:
    """The O(num_bins) counters agree with a full scan."""
    assert be.bin_stats() == be.scan_bin_stats()


# ----------------------------------------------------------------------------- encoding


@given(st.lists(st.tuples(st.integers(0, MAX_NUM_BINS - 1), INT64), max_size=50))
def test_int64_encoding_roundtrip_and_order(pairs: list[tuple[int, int]]) -> None:
    bins = np.array([b for b, _ in pairs], dtype=np.int64)
    keys = np.array([k for _, k in pairs], dtype=np.int64)
    raw = encode_keys(bins, keys, "int64")
    assert all(len(r) == 12 for r in raw)
    b2, k2 = decode_keys(raw, "int64")
    assert b2.tolist() == bins.tolist() and k2.tolist() == keys.tolist()
    assert bins_of_raw(raw).tolist() == bins.tolist()
    # byte order of raw keys == (bin, signed key) order
    assert sorted(raw) == [r for _, r in sorted(zip(pairs, raw, strict=True))]


@given(st.lists(st.tuples(st.integers(0, MAX_NUM_BINS - 1), TEXT), max_size=50))
def test_str_encoding_roundtrip(pairs: list[tuple[int, str]]) -> None:
    bins = [b for b, _ in pairs]
    keys = [k for _, k in pairs]
    raw = encode_keys(bins, keys, "str")
    b2, k2 = decode_keys(raw, "str")
    assert b2.tolist() == bins and list(k2) == keys
    assert all(r[:4] == bin_prefix(b) for r, b in zip(raw, bins, strict=True))


@pytest.mark.parametrize("key_type", ["int64", "str"])
@given(data=st.data())
def test_null_keys_encode_apart_from_every_key_and_round_trip(key_type: str,
                                                               data: st.DataObject) -> None:
    """A null key is bin prefix + 0xFF: one byte, never an int64 key's 8 nor valid UTF-8 (nor
    the empty string's zero bytes); it decodes back to None on every decode path."""
    keys_st = st.none() | (INT64 if key_type == "int64" else TEXT | st.just(""))
    pairs = data.draw(st.lists(st.tuples(st.integers(0, MAX_NUM_BINS - 1), keys_st), max_size=40))
    bins = [b for b, _ in pairs]
    keys = [k for _, k in pairs]
    raw = encode_keys(bins, keys, key_type)
    for r, b, k in zip(raw, bins, keys, strict=True):
        assert r[:4] == bin_prefix(b)
        assert (r[4:] == NULL_KEY) == (k is None)
    assert len(set(raw)) == len(set(pairs))  # distinct (bin, key) pairs stay distinct
    b2, k2 = decode_keys(raw, key_type)
    assert b2.tolist() == bins
    assert (k2.tolist() if isinstance(k2, np.ndarray) else list(k2)) == keys
    assert bins_of_raw(raw).tolist() == bins
    arrow_keys = pa.array(keys, KEY_ARROW_TYPES[key_type])
    assert encode_keys(bins, arrow_keys, key_type) == raw  # Arrow input (nulls as nulls)
    assert encode_keys(bins, pa.chunked_array([arrow_keys]), key_type) == raw
    if key_type == "int64":
        masked = np.ma.masked_array(np.array([0 if k is None else k for k in keys], np.int64),
                                    mask=[k is None for k in keys])
        assert encode_keys(bins, masked, key_type) == raw
        assert encode_keys(bins, np.array(keys, object), key_type) == raw
        got = decode_int_keys(pa.array(raw, pa.binary()))
        assert got is not None and got[0].tolist() == bins and got[1].tolist() == keys
        assert pa.array(got[1], pa.int64()).to_pylist() == keys  # masked -> Arrow nulls


def test_null_key_encoding_examples() -> None:
    assert encode_keys([0, 0], [None, ""], "str") == [b"\0\0\0\0\xff", b"\0\0\0\0"]
    assert encode_keys([3], [None], "int64") == [b"\0\0\0\x03\xff"]
    assert encode_keys([1], pa.nulls(1), "int64") == [b"\0\0\0\x01\xff"]
    with pytest.raises(TypeError):
        encode_keys([0, 0], [None, 1.5], "int64")
    with pytest.raises(ValueError, match="12 bytes"):
        decode_keys([b"\0\0\0\0\xfe", b"\0" * 12], "int64")
    assert decode_int_keys(pa.array([b"\0\0\0\0\xfe"], pa.binary())) is None


def test_ranges_and_meta_prefix() -> None:
    assert bin_range(5) == (b"\x00\x00\x00\x05", b"\x00\x00\x00\x06")
    assert bin_prefix(MAX_NUM_BINS - 1) + b"\xff" * 16 < META_PREFIX
    assert meta_key("x") == META_PREFIX + b"x"
    assert bin_runs([7, 1, 2, 3, 9, 8, 3]) == [(1, 4), (7, 10)]
    assert bin_runs([]) == []
    with pytest.raises(TypeError):
        encode_keys([0], [1.5], "int64")
    with pytest.raises(ValueError):
        encode_keys([0], [1], "float")


@given(st.lists(st.recursive(
    st.none() | st.booleans() | INT64 | st.floats(allow_nan=False) | TEXT | st.binary(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(TEXT, c, max_size=3), max_leaves=8,
), max_size=10))
def test_value_packing_roundtrip(values: list) -> None:
    packed = pack_values(values)
    assert unpack_values([*packed, None]) == [*values, None]
    assert [unpack_value(pack_value(v)) for v in values] == values


def test_numpy_values_pack_as_plain_numbers() -> None:
    packed = pack_value({"n": np.int64(3), "a": np.arange(3)})
    assert unpack_value(packed) == {"n": 3, "a": [0, 1, 2]}
    with pytest.raises(OverflowError):
        pack_value(2**64)


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("kind", BACKENDS)
@settings(max_examples=20)
@given(data=st.data(), key_type=st.sampled_from(["int64", "str"]))
def test_put_get_roundtrip(tmp_path: Path, kind: str, key_type: str, data: st.DataObject) -> None:
    keys_st = st.none() | (INT64 if key_type == "int64" else TEXT)  # None: the null key
    writes = data.draw(st.lists(st.lists(
        st.tuples(keys_st, st.integers(0, 15), INT64 | TEXT), max_size=30), max_size=4))
    model: dict[tuple[int, object], object] = {}
    with open_new(kind, tmp_path, key_type) as be:
        for batch in writes:
            # the bin is a function of the key (like hashing), so overwrites hit the same bin
            rows = [(k, hash(k) % 16, v) for k, _, v in batch]
            be.put_many([b for _, b, _ in rows], [k for k, _, _ in rows], [v for _, _, v in rows])
            for k, b, v in rows:
                model[(b, k)] = v
        keys = list(model)
        got = be.get_many([b for b, _ in keys], [k for _, k in keys])
        assert got == [model[k] for k in keys]
        # the same keys in a different bin are absent
        moved = be.get_many([(b + 1) % 16 for b, _ in keys], [k for _, k in keys])
        assert moved == [None] * len(keys)
        items = list(be.items())
        assert {(b, k): v for b, k, v in items} == model
        raw = [encode_keys([b], [k], key_type)[0] for b, k, _ in items]
        assert raw == sorted(raw) and len(items) == len(model)
        assert_stats_exact(be)


@pytest.mark.parametrize("kind", BACKENDS)
def test_raw_api_and_atomic_meta(tmp_path: Path, kind: str) -> None:
    path = os.path.join(fresh_dir(tmp_path), "db")
    be = open_backend(kind, path, "str", 8)
    keys = encode_keys([1, 1, 2], ["a", "b", "c"], "str")
    be.write_raw(keys, pack_values([1, 2, 3]), meta={"epoch": b"7"})
    assert unpack_values(be.get_raw(keys)) == [1, 2, 3]
    assert be.get_meta("epoch") == b"7" and be.get_meta("nope") is None
    # overwrite with explicit old values, delete with None, repeated key: last wins
    be.write_raw([keys[0], keys[2], keys[1], keys[1]], [pack_value(10), None, b"\x01", b"\x02"],
                 old_values=be.get_raw([keys[0], keys[2], keys[1], keys[1]]))
    assert be.get_raw(keys) == [pack_value(10), b"\x02", None]
    assert be.bin_stats() == {1: BinStats(2, len(keys[0]) + 1 + len(keys[1]) + 1)}
    assert_stats_exact(be)
    before = (list(be.raw_items()), be.bin_stats(), be.get_meta("epoch"))
    with pytest.raises(TypeError):  # a bad value aborts the whole write: nothing applied
        be.write_raw([keys[2], keys[0]], [b"\x05", 5], meta={"epoch": b"8"})  # type: ignore[list-item]
    with pytest.raises(ValueError):
        be.write_raw([meta_key("epoch")], [b"x"])
    with pytest.raises(ValueError):
        be.put_meta("megaphone.bin_stats", b"")
    assert (list(be.raw_items()), be.bin_stats(), be.get_meta("epoch")) == before
    be.put_meta("epoch", b"9")
    be.close()
    with open_backend(kind, path, "str", 8) as again:
        assert again.get_meta("epoch") == b"9"
        assert list(again.raw_items()) == before[0] and again.bin_stats() == before[1]


# ----------------------------------------------------------------------------- migration


def _fill(be: StateBackend, rows: list[tuple[int, int, int]]) -> None:
    if rows:
        be.put_many([b for b, _, _ in rows], [k for _, k, _ in rows], [v for _, _, v in rows])


rows_st = st.lists(st.tuples(st.integers(0, 31), st.none() | INT64, INT64), max_size=60)


@pytest.mark.parametrize("method", ["chunk", "sst"])
@pytest.mark.parametrize(("src_kind", "dst_kind"),
                         [("memory", "memory"), ("rocksdb", "rocksdb"), ("memory", "rocksdb")])
@settings(max_examples=15)
@given(src_rows=rows_st, dst_rows=rows_st, chosen=st.sets(st.integers(0, 31), max_size=12),
       chunk=st.sampled_from([1, 40, 4 << 20]))
def test_export_import_drop_moves_exactly_the_chosen_bins(
    tmp_path: Path, src_kind: str, dst_kind: str, method: str,
    src_rows: list, dst_rows: list, chosen: set[int], chunk: int,
) -> None:
    src = open_new(src_kind, tmp_path, num_bins=32)
    dst = open_new(dst_kind, tmp_path, num_bins=32)
    _fill(src, src_rows)
    _fill(dst, [r for r in dst_rows if r[0] not in chosen])  # receiver does not own them yet
    src_before, dst_before = raw_by_bin(src), raw_by_bin(dst)

    batches = list(src.export_bins(chosen, chunk_bytes=chunk))
    assert raw_by_bin(src) == src_before  # export is read-only
    assert all(b.schema == EXPORT_SCHEMA for b in batches)
    exported = [(k, v) for b in batches for k, v in zip(b.column("k").to_pylist(),
                                                         b.column("v").to_pylist(), strict=True)]
    assert exported == [e for b in sorted(chosen) for e in src_before.get(b, [])]

    stats = dst.import_bins(batches, method=method)
    assert stats.keys == len(exported)
    src.drop_bins(chosen)

    src_after, dst_after = raw_by_bin(src), raw_by_bin(dst)
    for b in range(32):
        if b in chosen:
            assert b not in src_after
            assert dst_after.get(b) == src_before.get(b)
        else:
            assert src_after.get(b) == src_before.get(b)
            assert dst_after.get(b) == dst_before.get(b)
    assert_stats_exact(src)
    assert_stats_exact(dst)
    if dst_kind == "rocksdb":  # the temporary SST directory is gone
        assert not [p for p in os.listdir(str(dst.path)) if p.startswith(".megaphone")]
    src.close()
    dst.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_export_chunks_stay_bounded_for_a_huge_bin(tmp_path: Path, kind: str) -> None:
    n, chunk = 50_000, 64 << 10
    with open_new(kind, tmp_path) as be:
        keys = np.arange(n, dtype=np.int64)
        be.put_many(np.full(n, 3), keys, (keys * 7).tolist())
        be.put_many([2, 4], [1, 1], [0, 0])
        stats = be.bin_stats()
        max_entry = max(len(k) + len(v) for k, v in be.raw_items([3]))
        sizes, total, last = [], 0, b""
        for batch in be.export_bins([3], chunk_bytes=chunk):
            k, v = batch.column("k"), batch.column("v")
            sizes.append(sum(map(len, k.to_pylist())) + sum(map(len, v.to_pylist())))
            total += len(batch)
            assert k[0].as_py() > last
            last = k[len(k) - 1].as_py()
        assert total == n and len(sizes) >= 10
        assert max(sizes) <= chunk + max_entry
        assert be.bin_stats() == stats


@pytest.mark.parametrize("kind", BACKENDS)
@settings(max_examples=15)
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("put"), st.lists(st.tuples(st.integers(0, 7), st.integers(0, 40),
                                                  st.binary(max_size=6)), max_size=20)),
    st.tuples(st.just("del"), st.lists(st.tuples(st.integers(0, 7), st.integers(0, 40)),
                                       max_size=8)),
    st.tuples(st.sampled_from(["chunk", "sst"]),
              st.lists(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 40),
                                          st.binary(max_size=6)), max_size=10), max_size=3)),
    st.tuples(st.just("drop"), st.sets(st.integers(0, 7), max_size=4)),
), max_size=10))
def test_bin_stats_match_a_scan_after_random_operations(tmp_path: Path, kind: str, ops: list
                                                        ) -> None:
    model: dict[bytes, bytes] = {}
    with open_new(kind, tmp_path, num_bins=8) as be:
        for op, arg in ops:
            if op == "put":
                keys = encode_keys([b for b, _, _ in arg], [k for _, k, _ in arg], "int64")
                be.write_raw(keys, [v for _, _, v in arg])
                model.update(zip(keys, [v for _, _, v in arg], strict=True))
            elif op == "del":
                keys = encode_keys([b for b, _ in arg], [k for _, k in arg], "int64")
                be.write_raw(keys, [None] * len(keys))
                for k in keys:
                    model.pop(k, None)
            elif op == "drop":
                be.drop_bins(arg)
                model = {k: v for k, v in model.items() if k[3] not in arg}
            else:  # import batches that may be unsorted, repeat keys, and hit owned bins
                batches = []
                for rows in arg:
                    keys = encode_keys([b for b, _, _ in rows], [k for _, k, _ in rows], "int64")
                    vals = [v for _, _, v in rows]
                    batches.append(pa.RecordBatch.from_arrays(
                        [pa.array(keys, pa.binary()), pa.array(vals, pa.binary())],
                        schema=EXPORT_SCHEMA))
                    model.update(zip(keys, vals, strict=True))
                be.import_bins(batches, method=op)
            assert_stats_exact(be)
        assert dict(be.raw_items()) == model


def _batch(bins: list[int], keys: list[int], values: list[object]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(encode_keys(bins, keys, "int64"), pa.binary()),
         pa.array(pack_values(values), pa.binary())],
        schema=EXPORT_SCHEMA)


@pytest.mark.parametrize("method", ["chunk", "sst"])
@pytest.mark.parametrize("kind", BACKENDS)
def test_import_stream_that_repeats_keys(tmp_path: Path, kind: str, method: str) -> None:
    # Batches that restart below the previous one, unsorted batches and repeated keys must not
    # be mistaken for fresh keys of empty bins (the counters would count them twice).
    with open_new(kind, tmp_path, num_bins=4) as be:
        be.import_bins([_batch([0], [5], [b"a"]), _batch([0], [5], [b"bb"]),
                        _batch([0, 1], [7, 1], [b"c", b"d"]), _batch([0, 0], [3, 7], [b"", b"e"]),
                        _batch([2, 2, 1], [9, 9, 1], [b"f", b"gg", b"h"])], method=method)
        assert be.bin_stats() == be.scan_bin_stats()
        assert [(b, k, v) for b, k, v in be.items()] == [
            (0, 3, b""), (0, 5, b"bb"), (0, 7, b"e"), (1, 1, b"h"), (2, 9, b"gg")]


@pytest.mark.parametrize("kind", BACKENDS)
def test_sst_import_into_owned_bins_and_many_files(tmp_path: Path, kind: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sst_files, "SST_FILE_BYTES", 2_000)  # force several SST files
    with open_new(kind, tmp_path, num_bins=4) as src, open_new(kind, tmp_path, num_bins=4) as dst:
        src.put_many(np.arange(4000) % 4, np.arange(4000), list(range(4000)))
        dst.put_many([0, 1], [0, 10**6], ["old", "mine"])  # key 0 gets overwritten
        dst.import_sst(src.export_bins([0, 1, 2], chunk_bytes=1 << 12))
        want = {(b, k): v for b, k, v in src.items([0, 1, 2])} | {(1, 10**6): "mine"}
        assert {(b, k): v for b, k, v in dst.items()} == want
        assert_stats_exact(dst)


@pytest.mark.parametrize("kind", BACKENDS)
def test_import_auto_picks_by_size(tmp_path: Path, kind: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with open_new(kind, tmp_path) as src, open_new(kind, tmp_path) as dst:
        src.put_many(np.arange(2000) % 16, np.arange(2000), [b"x" * 20] * 2000)
        small = dst.import_bins(src.export_bins([0]), method="auto")
        assert small.method == "chunk" and small.keys == 125
        monkeypatch.setattr(backend_base, "SST_MIN_BYTES", 1000)
        big = dst.import_bins(src.export_bins(range(1, 16), chunk_bytes=500))
        assert big.method == ("sst" if kind == "rocksdb" else "chunk")
        assert big.keys == 1875
        assert list(dst.raw_items()) == list(src.raw_items())
        owned = dst.import_bins(src.export_bins(range(16), chunk_bytes=500))  # bins not empty
        assert owned.method == "chunk" and owned.keys == 2000
        dst.drop_bins(range(16))
        shuffled = list(src.export_bins(range(16), chunk_bytes=500))[::-1]  # out of key order
        assert dst.import_bins(shuffled).method == "chunk"
        assert list(dst.raw_items()) == list(src.raw_items())
        assert_stats_exact(dst)
        assert_stats_exact(dst)
        with pytest.raises(ValueError):
            dst.import_bins([], method="fast")


# ----------------------------------------------------------------------------- persistence


@pytest.mark.parametrize("kind", BACKENDS)
def test_checkpoint_reopens_identical(tmp_path: Path, kind: str) -> None:
    with open_new(kind, tmp_path, "str") as be:
        be.put_many([1, 2, 3], ["a", "b", "c"], [{"n": 1}, [2], "3"])
        be.put_meta("epoch", b"4")
        dest = os.path.join(fresh_dir(tmp_path), "cp")
        be.checkpoint(dest)
        items, stats = list(be.items()), be.bin_stats()
        be.put_many([1], ["z"], [0])  # later writes do not leak into the checkpoint
    with open_checkpoint(kind, dest, "str", 16) as cp:
        assert list(cp.items()) == items and cp.bin_stats() == stats
        assert cp.get_meta("epoch") == b"4"
        with pytest.raises(PermissionError):
            cp.put_many([0], ["q"], [1])


def test_memory_backend_persists_across_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "mem")
    code = (
        "from megaphone.state_backends import open_backend\n"
        f"be = open_backend('memory', {path!r}, 'int64', 64)\n"
        "be.put_many([5, 6], [-1, 2**40], [{'a': b'x'}, 1.5])\n"
        "be.put_meta('epoch', b'3')\n"
        "be.close()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
    assert sorted(os.listdir(path)) == ["state.msgpack"]
    be = open_backend("memory", path, "int64", 64)
    assert list(be.items()) == [(5, -1, {"a": b"x"}), (6, 2**40, 1.5)]
    assert be.get_meta("epoch") == b"3"
    assert_stats_exact(be)
    be.drop_bins([5])
    be.close()
    with open_backend("memory", path, "int64", 64, read_only=True) as ro:
        assert list(ro.items()) == [(6, 2**40, 1.5)] and set(ro.bin_stats()) == {6}


def test_rocksdb_read_only_exporter(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    with open_backend("rocksdb", path, "int64", 16) as be:
        be.put_many([1, 2], [1, 2], [1, 2])
    with open_backend("rocksdb", path, "int64", 16, read_only=True) as ro:
        assert [b.num_rows for b in ro.export_bins([1, 2])] == [2]
        with pytest.raises(PermissionError):
            ro.drop_bins([1])
    with pytest.raises(FileNotFoundError):
        open_backend("rocksdb", str(tmp_path / "missing"), "int64", 16, read_only=True)


@pytest.mark.parametrize("kind", BACKENDS)
def test_mismatched_store_is_refused(tmp_path: Path, kind: str) -> None:
    path = str(tmp_path / "db")
    open_backend(kind, path, "int64", 16).close()
    with pytest.raises(ValueError, match="key_type"):
        open_backend(kind, path, "str", 16)
    with pytest.raises(ValueError, match="num_bins"):
        open_backend(kind, path, "int64", 32)
    other = "rocksdb" if kind == "memory" else "memory"
    with pytest.raises(ValueError):
        open_backend(other, path, "int64", 16)
    open_backend(kind, path, "int64", 16).close()  # the right parameters still open


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown state backend"):
        open_backend("leveldb", None, "int64", 16)
    with pytest.raises(ValueError):
        open_backend("memory", None, "int64", 12)
    with pytest.raises(ValueError):
        open_backend("memory", None, "bytes", 16)
    be = open_backend("memory", None, "int64", 16)
    with pytest.raises(ValueError):
        be.put_many([16], [1], [1])
    with pytest.raises(ValueError):
        list(be.export_bins([-1]))
    assert isinstance(be, StateBackend)


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=60))
def test_unpack_ints_decodes_every_msgpack_integer_format(values):
    arr = pa.array([pack_value(v) for v in values], pa.binary())
    assert unpack_ints(arr).tolist() == values
    assert unpack_ints(arr.slice(1)).tolist() == values[1:]  # offsets of a sliced array


@pytest.mark.parametrize("other", [1.5, "a", None, [1], 2**64 - 1, True])
def test_unpack_ints_leaves_anything_else_to_the_caller(other):
    arr = pa.array([pack_value(3), pack_value(other)], pa.binary())
    assert unpack_ints(arr) is None


@given(st.lists(st.tuples(st.integers(0, 4095), st.integers(-(2**63), 2**63 - 1)), max_size=40))
def test_decode_int_keys_matches_the_per_key_decoder(pairs):
    bins = np.array([b for b, _ in pairs], np.int64)
    keys = np.array([k for _, k in pairs], np.int64)
    raw = encode_keys(bins, keys, "int64")
    got = decode_int_keys(pa.array(raw, pa.binary()))
    assert got is not None
    assert got[0].tolist() == bins.tolist() and got[1].tolist() == keys.tolist()
    assert decode_int_keys(pa.array([b"\x00\x00\x00\x01abc"], pa.binary())) is None  # str key


@pytest.mark.parametrize("kind", BACKENDS)
def test_backends_check_key_type_and_bins_like_routing(tmp_path: Path, kind: str) -> None:
    """Backends apply routing's rules: 1 bin (no migration possible) and unknown types fail."""
    with pytest.raises(ValueError, match=r"power of two from 2 to 2\*\*20"):
        open_backend(kind, str(tmp_path / "one"), "int64", 1)
    with pytest.raises(ValueError, match="key_type must be one of"):
        open_backend(kind, str(tmp_path / "bad"), "int32", 16)
