"""Every shuffle row says what it is (:class:`~megaphone.migrator.task.columns.RowKind`): each
producer sets it, each consumer selects by it, and a row of no known kind fails the task rather
than being dropped. Arrow only: no Spark, no store service."""

from __future__ import annotations

import pyarrow as pa
import pytest

from megaphone.migrator.task import columns as C
from megaphone.migrator.task.columns import RowKind
from megaphone.migrator.task.hot_split import fold_partials, pass_and_fold, take_partials
from megaphone.migrator.task.spec import EpochSpec, shuffle_schema, with_labels
from megaphone.migrator.task.transfer import Arrivals, TimedInput, export_rows, rows
from megaphone.migrator.task.updates import make_update
from megaphone.records import WorkerMetrics
from megaphone.state_backends.bin_files import BinFile

SCHEMA = shuffle_schema(pa.int64(), pa.int64(), False)


def _spec(tmp_path, schema=SCHEMA, **kw) -> EpochSpec:
    return EpochSpec(epoch=1, state_dir=str(tmp_path), backend="memory", key_type="int64",
                     num_bins=8, update=make_update("sum", "int"),
                     output_schema=pa.schema([("k", pa.int64()), ("o", pa.int64())]),
                     chunk_bytes=4, shuffle_schema=schema, **kw)


def _records(keys, schema=SCHEMA, labels=None) -> pa.RecordBatch:
    n = len(keys)
    columns = {C.WORKER: pa.array([1] * n, pa.int32()), C.BIN: pa.array([0] * n, pa.int32()),
               C.KEY: pa.array(keys, pa.int64()), C.VALUE: pa.array([1] * n, pa.int64())}
    if labels is not None:
        columns[C.LABEL] = pa.array(labels, pa.int64())
    return rows(schema, n, columns, RowKind.RECORD)


def _kinds(batches) -> list[RowKind]:
    return [RowKind(k) for b in batches for k in b.column(C.KIND).to_pylist()]


class _Store:
    """What an exporter reads of a store: bin 2 as one chunk of rows, bin 3 as a file."""

    remote = False  # this host's store: the parts name this host

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, bins, *_args, **_kw):
        if bins == [2]:
            yield pa.record_batch({"k": pa.array([b"a", b"b"]), "v": pa.array([b"1", b"2"])})
        else:
            yield BinFile(3, 1, 10, 10, self.path, "f3")


def _exported(tmp_path) -> list[pa.RecordBatch]:
    path = tmp_path / "f3.sst"
    path.write_bytes(b"x" * 10)  # three parts of at most chunk_bytes (4)
    spec = _spec(tmp_path, outgoing={0: ((2, 1), (3, 1))})
    return list(export_rows(spec, 0, _Store(str(path))))


def test_the_kind_is_an_int8_column_of_every_shuffle_schema():
    for schema in (SCHEMA, with_labels(SCHEMA)):
        assert schema.field(C.KIND).type == pa.int8() and not schema.field(C.KIND).nullable


def test_an_exporter_ships_state_file_parts_and_its_report_each_of_its_kind(tmp_path):
    assert _kinds(_exported(tmp_path)) == [RowKind.STATE] * 2 + [RowKind.FILE_PART] * 3 + \
        [RowKind.EXPORT_REPORT]


def test_lessees_send_partials_and_pass_records_on_as_records(tmp_path):
    spec = _spec(tmp_path, split_keys=(7,))
    out = list(pass_and_fold(spec, iter([_records([7, 1, 7, 2])])))
    assert [(b.column(C.KEY).to_pylist(), _kinds([b])) for b in out] == [
        ([1, 2], [RowKind.RECORD] * 2), ([7], [RowKind.PARTIAL])]
    labelled = with_labels(SCHEMA)  # a group's job: one partial per key and epoch label
    grouped = _spec(tmp_path, labelled, split_keys=(7,), labels=(10, 11))
    out = list(fold_partials(grouped, iter([_records([7, 7, 7], labelled, [10, 11, 11])])))
    assert _kinds(out) == [RowKind.PARTIAL] * 2
    assert [b.column(C.LABEL).to_pylist() for b in out] == [[10], [11]]


def test_a_worker_sorts_its_input_by_kind(tmp_path):
    spec = _spec(tmp_path, split_keys=(7,))
    partials = list(fold_partials(spec, iter([_records([7, 7])])))
    timed = TimedInput(iter([_records([1, 2]), *_exported(tmp_path), *partials]))
    arrivals = Arrivals(spec, 1, str(tmp_path / "store"), WorkerMetrics(keys_in=0, bytes_in=0))
    chunks = list(arrivals.chunks(timed))
    assert [c.column("k").to_pylist() for c in chunks] == [[b"a", b"b"]]
    assert [(f.bin, f.size) for f in arrivals.files.complete()] == [(3, 10)]
    assert len(timed.export_reports) == 1
    records, got = take_partials(pa.Table.from_batches(arrivals.records))
    assert records.column(C.KEY).to_pylist() == [1, 2]
    assert got is not None and (got.keys, got.records, got.partials) == ([7], [2], [2])


@pytest.mark.parametrize("kind", [None, 9])
def test_a_row_of_unknown_kind_fails_loudly(kind):
    batch = _records([1, 2])
    batch = batch.set_column(batch.schema.get_field_index(C.KIND), SCHEMA.field(C.KIND),
                             pa.array([RowKind.RECORD, kind], pa.int8()))
    with pytest.raises(RuntimeError, match=r"1 shuffle rows of unknown kind \(first: "
                                           f"{kind}; known: RECORD=0"):
        list(TimedInput(iter([batch])))
