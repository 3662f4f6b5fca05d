"""Homes: which host a worker's state lives on, as the commit record keeps it
(docs/placement.md). The host id, the assignment rule, the commit record with and without
homes, and a pipeline's metrics naming where each task ran."""

from __future__ import annotations

import threading

import pytest

from megaphone.migrator.statedir.commit import Commit
from megaphone.routing.placement import assign_homes, away
from megaphone.state_backends.host import HOST_ID, HostIdError, host_id


def test_a_host_id_is_kept_in_the_local_dir_and_differs_between_local_dirs(tmp_path):
    first = host_id(str(tmp_path / "a"))
    assert HOST_ID.fullmatch(first)
    assert (tmp_path / "a" / "host-id").read_text().strip() == first
    assert host_id(str(tmp_path / "b")) != first
    from megaphone.state_backends import host as host_mod
    host_mod._KNOWN.clear()  # another process on the same host reads the same id
    assert host_id(str(tmp_path / "a")) == first


def test_concurrent_first_writers_agree_on_one_id(tmp_path):
    from megaphone.state_backends import host as host_mod
    ids: list[str] = []

    def take() -> None:
        ids.append(host_id(str(tmp_path / "c")))
        host_mod._KNOWN.clear()

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["host-id"]  # no temp file left


def test_a_host_id_file_megaphone_did_not_write_is_refused(tmp_path):
    (tmp_path / "host-id").write_text("../../etc\n")
    with pytest.raises(HostIdError, match="does not hold a host id"):
        host_id(str(tmp_path))


def test_new_workers_are_homed_where_their_first_copy_was_made():
    # Workers 0-3 first ran on host a, worker 4 on host b: each copy stays where it was made.
    homes = assign_homes({}, [0, 1, 2, 3, 4], {0: "a", 1: "a", 2: "a", 3: "a", 4: "b"})
    assert homes == {0: "a", 1: "a", 2: "a", 3: "a", 4: "b"}
    # A scale-out: workers 2 and 3 get bins, 3 ran on the new host c, 2 reported no host; it
    # goes to the known host with the fewest homes (b, known from where 0 and 1 ran).
    after = assign_homes({0: "a", 1: "a"}, [0, 1, 2, 3], {0: "b", 1: "b", 3: "c"})
    assert after == {0: "a", 1: "a", 2: "b", 3: "c"}


def test_homes_stay_while_a_worker_holds_state_and_leave_with_it():
    before = {0: "a", 1: "b", 2: "a"}
    after = assign_homes(before, [0, 1], {0: "b", 1: "a"})  # tasks wandered; worker 2 left
    assert after == {0: "a", 1: "b"}
    assert away(after, {0: "b", 1: "b"}) == [0]
    assert assign_homes({}, [0], {}) == {}  # no host known yet: homed later


def test_a_commit_record_keeps_homes_and_reads_older_records_without_them():
    old = Commit.from_dict({"epoch": 3, "state_version": 1, "tokens": {"0": "t"}})
    assert old.homes == {} and old.worker_homes() == {}
    new = Commit(epoch=4, homes={"0": "a-0123abcd", "1": "b-0123abcd"})
    again = Commit.from_dict(new.to_dict())
    assert again == new and again.worker_homes() == {0: "a-0123abcd", 1: "b-0123abcd"}
    with pytest.raises(ValueError, match="homes must map workers to strings"):
        Commit.from_dict({"epoch": 1, "homes": {"w0": "a"}})


def test_a_pipeline_records_its_workers_homes_and_where_their_tasks_ran(spark, tmp_path):
    from megaphone import Pipeline
    from megaphone.inspect_cmd import describe, render

    local = str(tmp_path / "local")
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", update="count", workers=2,
                    num_bins=16, local_dir=local)
    try:
        for _ in range(2):
            pipe.process(spark.createDataFrame([(k,) for k in range(20)], "k long"))
        here = host_id(local)
        record = pipe.metric_records(last=1)[0]
        assert {m.host for m in record.per_worker.values()} == {here}
        assert record.away == []
        assert pipe.state_dir.read_commit().worker_homes() == {0: here, 1: here}
    finally:
        pipe.close()
    info = describe(str(tmp_path / "state"))
    assert info["homes"] == {"0": here, "1": here} and info["away"] == []
    assert here in render(info)


def test_a_checkpointed_pipelines_tasks_register_its_secret_with_their_hosts_service(
        spark, tmp_path):
    """With a checkpoint location, the tasks register the pipeline's secret (kept 0600 in the
    state directory) with their host's store service, which keeps it 0600 on the host."""
    import json
    import os

    from megaphone import Pipeline
    from megaphone.paths import registration_path

    local = str(tmp_path / "local")
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", update="count", workers=2,
                    num_bins=16, local_dir=local, checkpoint=str(tmp_path / "ckpt"))
    try:
        pipe.process(spark.createDataFrame([(k,) for k in range(20)], "k long"))
        secret = pipe.state_dir.secret()
        kept = registration_path(local, pipe.fingerprint.pipeline_id)
        assert json.loads(kept.read_text())["secret"] == secret
        assert oct(os.stat(kept).st_mode & 0o777) == "0o600"
        assert secret not in json.dumps(pipe.metrics()) and secret not in repr(pipe.config)
    finally:
        pipe.close()
