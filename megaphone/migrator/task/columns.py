"""The column names of an epoch's shuffle and of its tasks' results, defined once: a shuffle
row is bound for worker :data:`WORKER` and says what it is in :data:`KIND` (:class:`RowKind`).
"""

from enum import IntEnum


class RowKind(IntEnum):
    """What a shuffle row is (its :data:`KIND`): set by the row's producer, so its consumers
    select rows by kind, never by which payload column happens to be set."""

    #: A record, from the map side (or passed on by a lessee).
    RECORD = 0
    #: A key of moving state, from an exporter.
    STATE = 1
    #: A part of a moving bin's file, from an exporter.
    FILE_PART = 2
    #: A split hot key's partial, from a lessee.
    PARTIAL = 3
    #: An exporter's report.
    EXPORT_REPORT = 4


#: The worker a shuffle row goes to: its partition.
WORKER = "_w"
#: A shuffle row's :class:`RowKind` (int8, always set).
KIND = "_k"
#: The bin of a record or of a chunk of state.
BIN = "_bin"
#: A record's key.
KEY = "key"
#: A record's value.
VALUE = "value"
#: A record's event time, microseconds since the epoch.
EVENT_TIME = "_t"
#: A record's epoch label, in a group's job (docs/groups.md): the value of the batch's epoch
#: column, which the task maps to its epoch (:attr:`~megaphone.migrator.task.spec.EpochSpec.
#: labels`).
LABEL = "_e"
#: The epoch of a row of a group task's results (an output or a report).
OUT_EPOCH = "_oe"
#: A moving key's encoded key (null on records).
STATE_KEY = "_sk"
#: A moving key's encoded state.
STATE_VALUE = "_sv"
#: A part of a moving bin's file: its descriptor (msgpack; the part's bytes are in
#: :data:`STATE_VALUE`).
STATE_FILE = "_sf"
#: A split key's partial from a lessee (msgpack ``[records, partial]``; null on records).
PARTIAL = "_hp"
#: An exporter's JSON report, riding the shuffle to the worker that gets its first bin.
EXPORT_REPORT = "_em"
#: A task's JSON reports in its results (null on output rows).
REPORT = "_metrics"
#: The bins a worker applied records of, on its report's row.
LOAD_BINS = "_load_bins"
#: How many records of each of :data:`LOAD_BINS` the worker applied.
LOAD_COUNTS = "_load_counts"
#: The columns megaphone adds to a task's results (no key column may be called so).
RESULT_COLUMNS = (REPORT, LOAD_BINS, LOAD_COUNTS, OUT_EPOCH)
