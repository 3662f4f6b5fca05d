"""The column names of an epoch's shuffle and of its tasks' results, defined once.

A shuffle row is a record (:data:`KEY`, :data:`VALUE`, :data:`EVENT_TIME`), a key of moving
state (:data:`STATE_KEY`, :data:`STATE_VALUE`), a part of a moving bin's file
(:data:`STATE_FILE`, :data:`STATE_VALUE`), a hot key's partial (:data:`PARTIAL`) or an
exporter's report (:data:`EXPORT_REPORT`),
bound for worker :data:`WORKER`. A task's results are its outputs, then rows of reports
(:data:`REPORT`) with the records it applied per bin (:data:`LOAD_BINS`, :data:`LOAD_COUNTS`).
"""

#: The worker a shuffle row goes to: its partition.
WORKER = "_w"
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
