"""The typed metrics records: what a worker reports and the epoch's record, as stored."""

from __future__ import annotations

from megaphone.records import EpochMetrics, WorkerMetrics, WorkerReport


def test_a_worker_record_holds_only_what_the_worker_reported():
    exporter = WorkerMetrics(bins_out=2, keys_out=10, bytes_out=300, export_s=0.5)
    assert exporter.to_dict() == {"bins_out": 2, "keys_out": 10, "bytes_out": 300,
                                  "export_s": 0.5}
    receiver = WorkerMetrics(records_in=3, records_out=3, replayed=False)
    assert receiver.to_dict() == {"records_in": 3, "records_out": 3, "replayed": False,
                                  "max_event_time": None}


def test_an_exporters_row_merges_into_the_receivers():
    receiver = WorkerMetrics(records_in=3, records_out=3, replayed=False, token="t")
    receiver.merge(WorkerMetrics(bins_out=1, keys_out=4, bytes_out=40, export_s=0.1))
    assert receiver.to_dict() == {"records_in": 3, "records_out": 3, "replayed": False,
                                  "max_event_time": None, "token": "t", "bins_out": 1,
                                  "keys_out": 4, "bytes_out": 40, "export_s": 0.1}


def test_a_report_round_trips_with_its_bytes_beside_the_metrics():
    report = WorkerReport(3, WorkerMetrics(bins_out=2, keys_out=5), {7: 100, 2: 50})
    back = WorkerReport.from_json(report.to_json())
    assert back == report and "bytes_by_bin" not in back.metrics.to_dict()


def test_an_epoch_record_round_trips_and_keeps_unknown_keys():
    record = EpochMetrics(epoch=4, batch_id=2, started=1.0, finished=3.0, duration_s=2.0,
                          records_in=5, per_worker={0: WorkerMetrics(records_in=5, useful_s=1.5),
                                                    1: WorkerMetrics(bins_out=1)},
                          phases_s={"admit": 0.1})
    stored = record.to_dict()
    assert list(stored) == ["epoch", "batch_id", "started", "finished", "duration_s",
                            "latency_s", "records_in", "records_out", "null_keys",
                            "routing_version", "workers", "bins_moved", "keys_moved",
                            "bytes_moved", "per_worker", "job_attempts", "phases_s",
                            "late_records", "split_records", "hot_keys", "group", "group_size",
                            "label", "away"]
    assert stored["per_worker"] == {"0": {"records_in": 5, "max_event_time": None,
                                          "useful_s": 1.5}, "1": {"bins_out": 1}}
    newer = {**stored, "from_a_newer_version": 1}
    back = EpochMetrics.from_dict(newer)
    assert back.to_dict() == newer and back.total("records_in") == 5


def test_an_exporters_parts_are_added_up_and_other_fields_win():
    """Receivers that pull each report the part of a sender's export they read
    (docs/transfer.md, "Receivers that pull"): merging adds those parts up; any other field
    the later report holds wins, as before."""
    merged = WorkerMetrics(bins_out=2, keys_out=10, export_s=0.5, export_spans=[[1, 0.0, 0.1]],
                           records_in=7)
    merged.merge(WorkerMetrics(bins_out=1, keys_out=5, export_s=0.25,
                               export_spans=[[2, 0.1, 0.2]], records_in=9))
    assert (merged.bins_out, merged.keys_out, merged.export_s) == (3, 15, 0.75)
    assert merged.export_spans == [[1, 0.0, 0.1], [2, 0.1, 0.2]] and merged.records_in == 9
