"""Key -> bin routing: numpy XXH64 vs the xxhash package, bins vs Spark, input forms, errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

from megaphone.routing.bins import bin_column, bin_of, validate_num_bins, xxhash64_unsigned
from megaphone.routing.keys import KEY_ARROW_TYPES, KEY_SPARK_CASTS, KEY_TYPES, key_type_of

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Characters of 1, 2, 3 and 4 UTF-8 bytes, so string byte lengths hit every tail size.
MIXED_ALPHABET = "az09 ~éßøЖ中文字ひ한😀🚀𝄞"


def ref_int(key: int) -> int:
    return xxhash.xxh64_intdigest(key.to_bytes(8, "little", signed=True), seed=42)


def ref_str(key: str) -> int:
    return xxhash.xxh64_intdigest(key.encode("utf-8"), seed=42)


def ref_bin(hashed: int, num_bins: int) -> int:
    return hashed >> (64 - (num_bins.bit_length() - 1))


def random_strings(rng: np.random.Generator, n: int, max_len: int) -> list[str]:
    """``n`` strings of 0..max_len characters drawn from MIXED_ALPHABET (incl. empty ones)."""
    alphabet = np.array(list(MIXED_ALPHABET))
    lengths = rng.integers(0, max_len + 1, n)
    chars = alphabet[rng.integers(0, alphabet.size, int(lengths.sum()))]
    joined = "".join(chars.tolist())
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends[:-1]]
    return [joined[a:b] for a, b in zip(starts, ends, strict=True)]


def string_of_utf8_length(n_bytes: int, seed: int) -> str:
    """A string of exactly ``n_bytes`` UTF-8 bytes mixing 1- to 4-byte characters."""
    rng = np.random.default_rng(seed)
    out: list[str] = []
    left = n_bytes
    while left:
        ch = MIXED_ALPHABET[int(rng.integers(0, len(MIXED_ALPHABET)))]
        if len(ch.encode()) <= left:
            out.append(ch)
            left -= len(ch.encode())
    return "".join(out)


# ------------------------------------------------------------------------------------------
# numpy XXH64 == xxhash package
# ------------------------------------------------------------------------------------------


@given(st.lists(INT64, max_size=50))
def test_xxh64_int64_matches_xxhash(keys: list[int]) -> None:
    got = xxhash64_unsigned(np.array(keys, dtype=np.int64))
    assert got.dtype == np.uint64
    assert got.tolist() == [ref_int(k) for k in keys]


def test_xxh64_int64_edge_values() -> None:
    keys = [0, 1, -1, 2**63 - 1, -(2**63), 42, -42, 2**32, 2**31 - 1]
    assert xxhash64_unsigned(keys).tolist() == [ref_int(k) for k in keys]


@given(st.lists(st.text(max_size=80), max_size=30))
def test_xxh64_text_matches_xxhash(keys: list[str]) -> None:
    assert xxhash64_unsigned(keys).tolist() == [ref_str(k) for k in keys]


@given(st.data())
@pytest.mark.parametrize("n_chars", [0, 1, 3, 4, 7, 8, 15, 16, 31, 32, 33, 63, 64, 65, 96, 97])
def test_xxh64_text_around_stripe_boundaries(n_chars: int, data: st.DataObject) -> None:
    keys = data.draw(st.lists(st.text(min_size=n_chars, max_size=n_chars), min_size=1))
    assert xxhash64_unsigned(keys).tolist() == [ref_str(k) for k in keys]


def test_xxh64_every_utf8_length_0_to_200() -> None:
    # Every byte length 0..200, each as ASCII, as mixed 1-4 byte UTF-8, all in one batch,
    # shuffled so lengths interleave; plus whole-character strings of emoji and CJK.
    keys = [string_of_utf8_length(n, seed=n) for n in range(201)]
    keys += ["x" * n for n in range(201)]
    keys += ["😀" * n for n in range(51)] + ["中" * n for n in range(67)]
    np.random.default_rng(0).shuffle(keys)
    assert {len(k.encode()) for k in keys} >= set(range(201))
    assert xxhash64_unsigned(keys).tolist() == [ref_str(k) for k in keys]


def test_xxh64_long_strings() -> None:
    keys = ["a" * 1000, "😀" * 333, "", string_of_utf8_length(4097, seed=1), "b"]
    assert xxhash64_unsigned(keys).tolist() == [ref_str(k) for k in keys]


# ------------------------------------------------------------------------------------------
# bins == Spark's xxhash64
# ------------------------------------------------------------------------------------------


def test_bins_match_spark(spark) -> None:
    rng = np.random.default_rng(2024)
    n = 100_000
    ints = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
    ints[:4] = [0, -1, 2**63 - 1, -(2**63)]
    strs = random_strings(rng, n, max_len=70)
    strs[:3] = ["", "😀", "a" * 32]
    df = spark.createDataFrame(pa.table({"i": ints, "s": pa.array(strs, pa.string())}))
    cols = []
    for num_bins in (2, 4096, 2**20):
        cols.append(bin_column("i", num_bins).alias(f"i_{num_bins}"))
        cols.append(bin_column(df["s"], num_bins, key_type="str").alias(f"s_{num_bins}"))
    out = df.select("i", "s", *cols).toArrow()
    assert out.num_rows == n
    for num_bins in (2, 4096, 2**20):
        spark_i = out[f"i_{num_bins}"].to_numpy()
        spark_s = out[f"s_{num_bins}"].to_numpy()
        assert spark_i.min() >= 0 and spark_i.max() < num_bins
        np.testing.assert_array_equal(bin_of(out["i"], num_bins), spark_i)
        np.testing.assert_array_equal(bin_of(out["s"], num_bins), spark_s)


def test_bin_column_casts_narrow_ints_to_long(spark) -> None:
    df = spark.range(-500, 500).selectExpr(
        "id", "cast(id as int) as i32", "cast(id as short) as i16", "cast(id as string) as s"
    )
    out = df.select(
        "id",
        "s",
        bin_column("i32").alias("b32"),
        bin_column(df["i16"], key_type="int64").alias("b16"),
        bin_column("s", key_type="str").alias("bs"),
    ).toArrow()
    expected = bin_of(out["id"])
    np.testing.assert_array_equal(out["b32"].to_numpy(), expected)
    np.testing.assert_array_equal(out["b16"].to_numpy(), expected)
    np.testing.assert_array_equal(out["bs"].to_numpy(), bin_of(out["s"]))


def test_bin_column_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="key_type"):
        bin_column("k", 4096, key_type="int32")
    with pytest.raises(ValueError, match="num_bins"):
        bin_column("k", 3)


# ------------------------------------------------------------------------------------------
# bin_of: inputs, outputs
# ------------------------------------------------------------------------------------------


@given(st.lists(INT64, max_size=40), st.sampled_from([2, 16, 4096, 2**20]))
def test_bin_of_is_top_bits_of_hash(keys: list[int], num_bins: int) -> None:
    bins = bin_of(keys, num_bins)
    assert bins.dtype == np.int64
    assert bins.tolist() == [ref_bin(ref_int(k), num_bins) for k in keys]


def test_int_input_forms_agree() -> None:
    keys = [5, -3, 0, 2**40, 127, 2**63 - 1, -(2**63)]
    small = [5, 3, 0, 127, 100]
    expected = bin_of(keys)
    assert isinstance(expected, np.ndarray) and expected.dtype == np.int64
    forms = [
        tuple(keys),
        np.array(keys, dtype=np.int64),
        np.array(keys, dtype=object),
        pa.array(keys),
        pa.chunked_array([keys[:3], keys[3:]], pa.int64()),
        pd.Series(keys),
    ]
    for form in forms:
        np.testing.assert_array_equal(bin_of(form), expected)
    small_expected = bin_of(small)
    for dtype in (np.int8, np.int16, np.int32, np.uint8, np.uint32):
        np.testing.assert_array_equal(bin_of(np.array(small, dtype=dtype)), small_expected)
        np.testing.assert_array_equal(
            bin_of(pa.array(small, pa.from_numpy_dtype(dtype))), small_expected
        )
    np.testing.assert_array_equal(bin_of(np.array([2**63 - 1], np.uint64)), bin_of([2**63 - 1]))
    for i, key in enumerate(keys):
        scalar = bin_of(key)
        assert type(scalar) is int and scalar == expected[i]
        assert bin_of(np.int64(key)) == scalar
    assert bin_of(np.int32(7), 2**20) == bin_of([7], 2**20)[0]


def test_str_input_forms_agree() -> None:
    keys = ["", "a", "héllo", "中文字", "😀" * 9, "x" * 40, "key-17"]
    expected = bin_of(keys, 2**20)
    assert isinstance(expected, np.ndarray) and expected.dtype == np.int64
    sliced = pa.array(["pad", *keys, "pad"], pa.string()).slice(1, len(keys))
    forms = [
        tuple(keys),
        np.array(keys),
        np.array(keys, dtype=object),
        pa.array(keys, pa.string()),
        pa.array(keys, pa.large_string()),
        pa.array(keys).dictionary_encode(),
        pa.chunked_array([keys[:2], [], keys[2:]], pa.string()),
        sliced,
        pd.Series(keys),
    ]
    for form in forms:
        np.testing.assert_array_equal(bin_of(form, 2**20), expected)
    for i, key in enumerate(keys):
        scalar = bin_of(key, 2**20)
        assert type(scalar) is int and scalar == expected[i]
        assert bin_of(np.str_(key), 2**20) == scalar


def test_empty_batches() -> None:
    for empty in ([], np.array([], np.int64), pa.array([], pa.string()), np.array([], "U1")):
        out = bin_of(empty)
        assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.size == 0
    assert xxhash64_unsigned([]).dtype == np.uint64


def test_bins_cover_range_evenly() -> None:
    keys = np.arange(200_000, dtype=np.int64)
    counts = np.bincount(bin_of(keys, 16), minlength=16)
    assert counts.size == 16
    assert np.all(np.abs(counts - 12_500) < 12_500 * 0.05)
    str_counts = np.bincount(bin_of([f"user-{i}" for i in range(50_000)], 8), minlength=8)
    assert np.all(np.abs(str_counts - 6_250) < 6_250 * 0.06)


def test_large_batches_match_reference() -> None:
    rng = np.random.default_rng(7)
    ints = rng.integers(-(2**63), 2**63 - 1, 20_000, dtype=np.int64, endpoint=True)
    sample = rng.integers(0, ints.size, 500)
    np.testing.assert_array_equal(
        xxhash64_unsigned(ints)[sample], [ref_int(int(k)) for k in ints[sample]]
    )
    strs = random_strings(rng, 20_000, max_len=150)
    got = xxhash64_unsigned(strs)
    assert got.tolist() == [ref_str(s) for s in strs]


# ------------------------------------------------------------------------------------------
# Validation and errors
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("num_bins", "log2"), [(2, 1), (4, 2), (4096, 12), (2**20, 20)])
def test_validate_num_bins_accepts_powers_of_two(num_bins: int, log2: int) -> None:
    assert validate_num_bins(num_bins) == log2
    assert validate_num_bins(np.int64(num_bins)) == log2
    assert validate_num_bins(np.uint32(num_bins)) == log2


@pytest.mark.parametrize(
    "bad", [0, 1, 3, -2, -4096, 4095, 2**21, 2**64, True, False, 4096.0, "4096", None, np.int64(6)]
)
def test_validate_num_bins_rejects(bad: object) -> None:
    with pytest.raises(ValueError, match=r"power of two from 2 to 2\*\*20") as info:
        validate_num_bins(bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)
    with pytest.raises(ValueError):
        bin_of([1, 2], bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "keys",
    [
        [1, "a"],
        ["a", 1],
        np.array([1, "a"], dtype=object),
        [1.5],
        [1, 2.0],
        1.5,
        [b"x"],
        b"x",
        [True, False],
        True,
        np.array([1.0, 2.0]),
        np.array([b"x"]),
        pa.array([1.0]),
        pa.array([b"x"]),
        {"a": 1},
        ["a", float("nan")],
    ],
)
def test_unsupported_or_mixed_keys_raise_type_error(keys: object) -> None:
    with pytest.raises(TypeError):
        bin_of(keys)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        key_type_of(keys)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("keys", "valid"),
    [
        ([None], []),
        ([1, None], [1]),
        ([None, -7, None], [-7]),
        (["a", None], ["a"]),
        ([None, "", "x" * 40], ["", "x" * 40]),
        (np.array(["a", None], dtype=object), ["a"]),
        (np.array([None, 3], dtype=object), [3]),
        (pa.array([1, None]), [1]),
        (pa.array(["a", None]), ["a"]),
        (pa.array(["a", None], pa.large_string()), ["a"]),
        (pa.array(["a", None, "a"]).dictionary_encode(), ["a", "a"]),
        (pa.chunked_array([[1], [None]], pa.int64()), [1]),
        (pa.array([None, 2], pa.int8()), [2]),
        (pa.nulls(3), []),
        (pd.Series(["a", None]), ["a"]),
    ],
)
def test_null_keys_hash_to_the_seed(keys: object, valid: list) -> None:
    """A null key is a key of its own: its hash is the seed (Spark's ``xxhash64(NULL)``), so it
    lives in bin 0; the other keys hash as they would without it."""
    h = xxhash64_unsigned(keys)  # type: ignore[arg-type]
    nulls = pa.array(keys if not isinstance(keys, pd.Series) else keys.tolist(),
                     from_pandas=True).is_null().to_numpy(zero_copy_only=False)
    assert h.dtype == np.uint64 and h[nulls].tolist() == [42] * int(nulls.sum())
    if valid:
        assert h[~nulls].tolist() == xxhash64_unsigned(valid).tolist()
    for num_bins in (2, 4096, 2**20):
        bins = bin_of(keys, num_bins)  # type: ignore[arg-type]
        assert isinstance(bins, np.ndarray) and bins[nulls].tolist() == [0] * int(nulls.sum())


def test_scalar_null_key_is_bin_zero() -> None:
    assert bin_of(None) == 0 and type(bin_of(None)) is int
    assert bin_of(None, 2**20) == 0
    assert xxhash64_unsigned(None).tolist() == [42]


def test_null_keys_match_spark(spark) -> None:
    """Spark's xxhash64 of a null key is the seed, and bin_column puts it in bin 0: bin_of
    agrees, for both key types."""
    df = spark.createDataFrame([(None, None), (5, "a"), (None, "")], "i long, s string")
    out = df.select(
        "i", "s",
        F.xxhash64("i").alias("hi"), F.xxhash64("s").alias("hs"),
        *[bin_column("i", n).alias(f"i_{n}") for n in (2, 4096, 2**20)],
        *[bin_column("s", n, key_type="str").alias(f"s_{n}") for n in (2, 4096, 2**20)],
    ).toArrow()
    assert out["hi"].to_pylist()[::2] == [42, 42] and out["hs"].to_pylist()[0] == 42
    np.testing.assert_array_equal(xxhash64_unsigned(out["i"]).view(np.int64), out["hi"])
    np.testing.assert_array_equal(xxhash64_unsigned(out["s"]).view(np.int64), out["hs"])
    for n in (2, 4096, 2**20):
        np.testing.assert_array_equal(bin_of(out["i"], n), out[f"i_{n}"])
        np.testing.assert_array_equal(bin_of(out["s"], n), out[f"s_{n}"])
        assert out[f"i_{n}"][0].as_py() == out[f"s_{n}"][0].as_py() == 0


@pytest.mark.parametrize("keys", [[None, 1.5], [None, b"x"], [None, True], [None, 1, "a"]])
def test_wrong_types_beside_null_keys_still_raise_type_error(keys: object) -> None:
    with pytest.raises(TypeError):
        bin_of(keys)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "keys",
    [
        2**63,
        -(2**63) - 1,
        [1, 2**63],
        [2**64],
        np.array([2**63], np.uint64),
        pa.array([2**63], pa.uint64()),
    ],
)
def test_out_of_int64_range_raises_value_error(keys: object) -> None:
    with pytest.raises(ValueError, match="int64"):
        bin_of(keys)  # type: ignore[arg-type]


def test_key_type_of() -> None:
    assert KEY_TYPES == ("int64", "str")
    assert tuple(KEY_ARROW_TYPES) == tuple(KEY_SPARK_CASTS) == KEY_TYPES
    for keys in (
        1,
        np.int32(1),
        [1, 2],
        np.arange(3),
        pa.array([1], pa.int8()),
        np.array([1], object),
    ):
        assert key_type_of(keys) == "int64"
    for keys in (
        "a",
        ["a", ""],
        np.array(["a"]),
        pa.array(["a"]),
        pa.array(["a"], pa.large_string()),
    ):
        assert key_type_of(keys) == "str"
    assert key_type_of(pa.chunked_array([["a"]])) == "str"
    assert key_type_of(np.array([], np.int64)) == "int64"
    with pytest.raises(ValueError, match="empty"):
        key_type_of([])
    # null keys are skipped; keys that are all untyped nulls show no type
    assert key_type_of([None, 1]) == key_type_of(pa.array([None], pa.int64())) == "int64"
    assert key_type_of(["a", None]) == key_type_of(pa.array([None], pa.string())) == "str"
    for nulls in (None, [None], [None, None], np.array([None], object), pa.nulls(2)):
        with pytest.raises(ValueError, match="all None/null"):
            key_type_of(nulls)  # type: ignore[arg-type]
