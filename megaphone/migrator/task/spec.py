"""What a task knows about its epoch: the :class:`EpochSpec` (small metadata, never bulk state)
and the schema of the epoch's one shuffle. The driver builds both; the worker's code
(:mod:`~megaphone.migrator.task.state_operator`, :mod:`~megaphone.migrator.task.transfer`) reads
them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa

from megaphone.migrator.task.columns import (
    BIN,
    EVENT_TIME,
    EXPORT_REPORT,
    KEY,
    KIND,
    LABEL,
    PARTIAL,
    STATE_FILE,
    STATE_KEY,
    STATE_VALUE,
    VALUE,
    WORKER,
)
from megaphone.migrator.task.updates import Update
from megaphone.paths import StateDirPaths, local_worker_path
from megaphone.state_backends.durable import SNAPSHOT_EVERY
from megaphone.state_backends.remote import default_local_dir


@dataclass(frozen=True)
class EpochSpec:
    """Everything a task needs to know about an epoch: small metadata, never bulk state.

    ``incoming``: worker -> bins it installs; ``outgoing``: old owner -> ``(bin, new owner)``
    pairs it exports; ``drops``: worker -> bins that left it last epoch; ``live``: workers
    owning bins; ``local_dir``: the host's store-service directory; ``pipeline_id``: whose state
    directory tasks must find (checked once per Python worker); ``transfer``: how moving bins
    travel. An event-time operator's ``watermark`` (us; ``None`` before any event time),
    ``owned`` (worker -> bins whose timers it fires) and ``processing_time_us`` (one for a
    group). Hot keys (docs/hot-keys.md): ``split_keys`` folded by ``lessees`` tasks (``None``:
    the input's partitions), ``sketch_capacity`` heaviest keys reported (0: none). A group
    (docs/groups.md): its epochs' ``labels`` (``epoch`` is the first's, the only one that moves
    bins) and ``watermarks``.
    """

    epoch: int
    state_dir: str
    backend: str
    key_type: str
    num_bins: int
    update: Update
    output_schema: pa.Schema
    chunk_bytes: int
    shuffle_schema: pa.Schema
    transfer: str = "auto"
    incoming: dict[int, tuple[int, ...]] = field(default_factory=dict)
    outgoing: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    drops: dict[int, tuple[int, ...]] = field(default_factory=dict)
    live: frozenset[int] = frozenset()
    has_event_time: bool = False
    local_dir: str = field(default_factory=default_local_dir)
    pipeline_id: str | None = None
    checkpoint: str | None = None
    snapshot_every: int = SNAPSHOT_EVERY
    committed_owners: frozenset[int] = frozenset()
    run_id: str = ""
    committed_tokens: dict[int, str] = field(default_factory=dict)
    watermark: int | None = None
    owned: dict[int, tuple[int, ...]] = field(default_factory=dict)
    split_keys: tuple = ()
    lessees: int | None = None
    sketch_capacity: int = 0
    #: The pipeline's secret (hex, with a checkpoint location): tasks register it with their
    #: host's store service (docs/placement.md). Never printed.
    secret: str = field(default="", repr=False)
    #: Per worker whose home's service is known: its home host and that service's address.
    homes: dict[int, tuple[str, tuple[str, int]]] = field(default_factory=dict)
    #: Per worker of :attr:`homes` whose address is another service of its home host: the
    #: worker's shard there, whose address a task away from home asks that service for.
    siblings: dict[int, int] = field(default_factory=dict)
    labels: tuple[int, ...] = ()
    watermarks: tuple[int | None, ...] = ()
    processing_time_us: int | None = None
    #: Per worker, the bins it is to send next, in order: its store service writes their files
    #: ahead while idle (docs/transfer.md, "Bins written ahead").
    ahead: dict[int, tuple[int, ...]] = field(default_factory=dict)
    #: When the driver started the epoch (``time.time()``; 0 unknown): store services learn
    #: the epochs' rhythm from it and write no bins ahead when the next is due.
    started_at: float = 0.0
    #: Whether each receiver reads the bins it installs from their senders' stores in its own
    #: task (docs/transfer.md, "Receivers that pull"), instead of export tasks before the
    #: shuffle (when: :func:`~megaphone.migrator.task.transfer.receivers_pull`).
    pull_exports: bool = False
    #: A chain's combine for this stage (:class:`~megaphone.Chain`'s ``combines``): each
    #: worker's outputs of an epoch pass through it before they are kept or leave the worker.
    combine_outputs: Callable[[pa.Table], pa.Table] | None = None

    @property
    def grouped(self) -> bool:
        """True for a group's spec: the job runs the epochs of :attr:`labels`."""
        return bool(self.labels)

    def for_epoch(self, i: int) -> EpochSpec:
        """The spec of the group's ``i``-th epoch as a task applies it: the first is the group's
        own; a later one moves no bin, and every worker that owns bins owned them before."""
        watermark = self.watermarks[i] if self.watermarks else self.watermark
        if i == 0:
            return replace(self, watermark=watermark)
        return replace(self, epoch=self.epoch + i, incoming={}, outgoing={}, drops={},
                       committed_owners=self.live, watermark=watermark)

    def required_epoch(self, worker: int) -> int | None:
        """The epoch ``worker``'s state must be at before this epoch (the last commit) when it
        owned bins then; ``None`` when its state does not matter (it owned none)."""
        return self.epoch - 1 if worker in self.committed_owners else None

    def worker_path(self, worker: int) -> Path:
        """The working copy of ``worker``: with a checkpoint location, on the disk of the host
        that runs the task (under ``local_dir``); else in the state directory."""
        if self.checkpoint is not None:
            return local_worker_path(self.local_dir, self.pipeline_id or "", worker)
        return StateDirPaths(self.state_dir).worker(worker)


#: The shuffle's columns of what is not a record (a record leaves them null): state, partial
#: aggregates, exporters' reports.
NOT_RECORDS = (pa.field(STATE_KEY, pa.binary()), pa.field(STATE_VALUE, pa.binary()),
               pa.field(STATE_FILE, pa.binary()), pa.field(PARTIAL, pa.binary()),
               pa.field(EXPORT_REPORT, pa.string()))


def shuffle_schema(key_type: pa.DataType, value_type: pa.DataType | None, event_time: bool
                   ) -> pa.Schema:
    """The rows of an epoch's one shuffle (:mod:`~megaphone.migrator.task.columns`): records, state
    and exporters' reports, each saying which in its kind column."""
    fields = [pa.field(WORKER, pa.int32()), pa.field(KIND, pa.int8(), nullable=False),
              pa.field(BIN, pa.int32()), pa.field(KEY, key_type)]
    if value_type is not None:
        fields.append(pa.field(VALUE, value_type))
    if event_time:
        fields.append(pa.field(EVENT_TIME, pa.int64()))
    return pa.schema([*fields, *NOT_RECORDS])


def with_labels(schema: pa.Schema) -> pa.Schema:
    """The shuffle ``schema`` of a group's job: its records also carry their epoch's label."""
    return schema.append(pa.field(LABEL, pa.int64()))


def row_bytes_bound(spec: EpochSpec) -> int | None:
    """At most how many bytes one shuffle row of the epoch takes in an Arrow batch bound for a
    worker's task, twice over (for Spark's ``maxBytesPerBatch``, :func:`~megaphone.spark.
    byte_cap_unchecked`); ``None`` when there is no such bound: state or partial aggregates
    cross the shuffle (exports not pulled by their receivers, split hot keys), or a record
    column has a variable width (a string, a list)."""
    if (spec.outgoing and not spec.pull_exports) or spec.split_keys:
        return None
    nulls = {f.name for f in NOT_RECORDS}
    total = 0
    for f in spec.shuffle_schema:
        # a null of a variable-width column: its offset and validity bit
        width = 5 if f.name in nulls else _fixed_bytes(f.type)
        if width is None:
            return None
        total += width
    return 2 * total


def _fixed_bytes(arrow_type: pa.DataType) -> int | None:
    """Bytes of one value of ``arrow_type`` with its validity bit rounded up to a byte (a struct
    of fixed-width fields: theirs and its own), ``None`` for a variable width."""
    if pa.types.is_struct(arrow_type):
        widths = [_fixed_bytes(f.type) for f in arrow_type]
        return None if None in widths else sum(w for w in widths if w is not None) + 1
    try:
        return arrow_type.bit_width // 8 + 1
    except ValueError:  # not fixed width
        return None
