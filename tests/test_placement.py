"""Homes: which host a worker's state lives on, as the commit record keeps it
(docs/placement.md). The host id, the assignment rule, the commit record with and without
homes, and a pipeline's metrics naming where each task ran."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megaphone.migrator.statedir.commit import Commit
from megaphone.routing.placement import (
    PlannedHome,
    assign_homes,
    away,
    hosts_needed,
    known_hosts,
    plan_homes,
)
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


def test_hosts_keep_each_shards_service_as_tasks_report_it():
    # Worker 0's task ran at home on a (2 shards), worker 1's away on b (one shard), worker 3's
    # on a: a's shards 0 and 1, b's one shard.
    hosts = known_hosts({}, [(0, "a", [2, "10.0.0.1", 7000]), (1, "b", [1, "10.0.0.2", 7100]),
                             (3, "a", [2, "10.0.0.1", 7001])])
    assert hosts == {"a": [["10.0.0.1", 7000], ["10.0.0.1", 7001]], "b": [["10.0.0.2", 7100]]}
    # b restarted its service (a new port), and now runs 2 shards; a was unreachable: dropped.
    after = known_hosts(hosts, [(2, "b", [2, "10.0.0.2", 7200])], unreachable=["a"])
    assert after == {"b": [["10.0.0.2", 7200], None]}


def test_new_workers_are_homed_before_their_first_epoch_on_the_hosts_with_fewest_homes():
    # Workers 0 and 1 at home on a, b known from their tasks that ran there away from home;
    # the new workers 2 and 3 both go to b, at its services for their shards.
    hosts = {"a": [["h", 1], ["h", 2]], "b": [["h", 3], ["h", 4]]}
    assert plan_homes({0: "a", 1: "a"}, [0, 1, 2, 3], hosts) == \
        {2: PlannedHome("b", ("h", 3)), 3: PlannedHome("b", ("h", 4))}
    # The placement bench's scale-out: only b's service for shard 0 was reported. Both still
    # go to b; worker 3's task asks that service for b's shard 1 (docs/placement.md).
    bench = {"a": [["h", 1], ["h", 2]], "b": [["h", 3], None]}
    assert plan_homes({0: "a", 1: "a"}, [0, 1, 2, 3], bench) == \
        {2: PlannedHome("b", ("h", 3)), 3: PlannedHome("b", ("h", 3), 1)}
    # Ties go by host id, whichever shards are known.
    assert plan_homes({}, [1, 2], {"b": [["h", 3], ["h", 4]], "a": [None, ["h", 2]]}) == \
        {1: PlannedHome("a", ("h", 2)), 2: PlannedHome("b", ("h", 3))}
    assert plan_homes({0: "a"}, [1], {}) == {}  # no host known yet: homed where it runs
    assert plan_homes({0: "a"}, [1], {"a": [None, None]}) == {}


def test_new_workers_are_homed_on_the_host_with_the_most_free_slots():
    # a has 2 homes of 8 slots, b 1 of 2: a has 6 free, b 1, so both new workers go to a
    # (fewest homes would have sent the first to b).
    hosts = {"a": [["h", 1], ["h", 2]], "b": [["h", 3], ["h", 4]]}
    assert plan_homes({0: "a", 1: "a", 4: "b"}, [2, 3], hosts, {"a": 8, "b": 2}) == \
        {2: PlannedHome("a", ("h", 1)), 3: PlannedHome("a", ("h", 2))}
    # Free slots tie: fewest homes, then host id, as without slots.
    assert plan_homes({0: "a", 1: "a", 4: "b"}, [2], hosts, {"a": 3, "b": 2})[2].host == "b"
    assert plan_homes({0: "a", 4: "b"}, [2], hosts, {"a": 2, "b": 2})[2].host == "a"
    # A host whose slots are unknown: slots are not compared at all (fewest homes wins).
    for slots in (None, {}, {"a": 8}):
        assert plan_homes({0: "a", 1: "a", 4: "b"}, [2], hosts, slots)[2].host == "b"


def test_the_hosts_a_worker_count_needs_are_counted_over_their_slots():
    assert hosts_needed(5, {"a": 4, "b": 4}) == 2
    assert hosts_needed(4, {"a": 4, "b": 4}) == 1
    assert hosts_needed(5, {"a": 1, "b": 4}) == 2  # the largest host first
    assert hosts_needed(11, {"a": 4, "b": 2}) == 4  # 6 known, then hosts of 4 slots
    assert hosts_needed(3, {}) is None


def test_a_commit_record_keeps_each_hosts_slots_and_homes_by_them(monkeypatch):
    """The driver's slots go into the commit record, which the next epoch's homes, DS2 and
    the deadline policy read; without a source the record keeps those of hosts still known."""
    from megaphone.migrator.epoch.routing_operator import EpochLayout, commit_record, new_homes
    from megaphone.migrator.statedir.commit import StreamPosition
    from megaphone.records import WorkerMetrics
    from megaphone.routing.table import Move

    monkeypatch.delenv("MEGAPHONE_PLACEMENT", raising=False)
    a, b = [["10.0.0.1", 7000]], [["10.0.0.2", 7000]]
    before = Commit(epoch=3, homes={"0": "a", "1": "a", "4": "b"}, hosts={"a": a, "b": b},
                    slots={"a": 8, "b": 2, "gone": 4})
    layout = EpochLayout(epoch=4, version=1, moves=(Move(5, 0, 2),),
                         live=frozenset({0, 1, 2, 4}), incoming={2: (5,)},
                         outgoing={0: ((5, 2),)}, drops={}, partitions=5)
    assert new_homes(layout, before)[2].host == "a"  # 6 free slots on a, 1 on b
    assert before.host_slots() == {"a": 8, "b": 2}
    per_worker = {w: WorkerMetrics(host="a", address=a[0], service=[1, *a[0]])
                  for w in (0, 1, 2)}
    assert commit_record(layout, StreamPosition(), [], per_worker, before).slots == \
        {"a": 8, "b": 2}
    given = commit_record(layout, StreamPosition(), [], per_worker, before,
                          lambda hosts: {h: 3 for h in hosts})
    assert given.slots == {"a": 3, "b": 3} and Commit.from_dict(given.to_dict()) == given
    assert Commit.from_dict({"epoch": 1}).slots == {}
    with pytest.raises(ValueError, match="slots must map host ids to positive integers"):
        Commit.from_dict({"epoch": 1, "slots": {"a": 0}})


_HOSTS = st.dictionaries(st.sampled_from("abcde"), st.integers(1, 3).flatmap(lambda n: st.lists(
    st.none() | st.just(["10.0.0.1", 7000]), min_size=n, max_size=n)), max_size=5)


@given(st.dictionaries(st.integers(0, 11), st.sampled_from("abcd"), max_size=8),
       st.sets(st.integers(0, 11), max_size=8), _HOSTS)
def test_planned_homes_have_known_services_spread_evenly_and_leave_old_homes(homes, new, hosts):
    planned = plan_homes(homes, new, hosts)
    assert set(planned) <= new - set(homes)  # existing homes never change
    counts = {h: list(homes.values()).count(h) for h in hosts}
    candidates = [h for h, s in hosts.items() if any(a is not None for a in s)]
    for w in sorted(planned):
        host, address, shard = planned[w]
        services = hosts[host]
        own = services[w % len(services)]
        if shard is None:  # the service for w's shard, known
            assert list(address) == own
        else:  # another known service of the host, to ask for w's shard's
            assert own is None and shard == w % len(services) and list(address) in services
        assert (counts[host], host) == min((counts[h], h) for h in candidates)  # fewest homes
        counts[host] += 1
    if candidates:  # left out only when no host has a known service
        assert set(planned) == new - set(homes)
    else:
        assert planned == {}


@given(st.dictionaries(st.integers(0, 11), st.sampled_from("ab"), max_size=6),
       st.sets(st.integers(0, 11), min_size=1, max_size=6),
       st.integers(1, 4), st.integers(0, 3), st.integers(0, 3))
def test_one_known_service_per_host_homes_new_workers_on_the_emptier_host(
        homes, new, shards, known_a, known_b):
    """Whichever single service of each host is known, every new worker is homed, each on the
    host with fewer homes at its turn (ties: a), at its shard's service or asking for it."""
    hosts = {h: [["10.0.0.9", 7000 + i] if i == k % shards else None for i in range(shards)]
             for h, k in (("a", known_a), ("b", known_b))}
    planned = plan_homes(homes, new, hosts)
    fresh = sorted(new - set(homes))
    assert sorted(planned) == fresh
    counts = {h: list(homes.values()).count(h) for h in "ab"}
    for w in fresh:
        emptier = "b" if counts["b"] < counts["a"] else "a"
        assert planned[w].host == emptier, (w, counts)
        known = next(i for i, s in enumerate(hosts[emptier]) if s is not None)
        assert planned[w].address == ("10.0.0.9", 7000 + known)
        assert planned[w].shard == (None if w % shards == known else w % shards)
        counts[emptier] += 1


def test_an_epoch_runs_and_commits_its_new_workers_at_the_homes_chosen_before_it(monkeypatch):
    """The task spec and the commit record agree on the homes chosen before the epoch; a new
    worker whose task could not reach its chosen home is homed where it ran, and that host's
    addresses are forgotten until a task reports them again."""
    from megaphone.migrator.epoch.routing_operator import EpochLayout, commit_record, new_homes
    from megaphone.migrator.statedir.commit import StreamPosition
    from megaphone.records import WorkerMetrics
    from megaphone.routing.table import Move

    monkeypatch.delenv("MEGAPHONE_PLACEMENT", raising=False)
    a, b = [["10.0.0.1", 7000], ["10.0.0.1", 7001]], [["10.0.0.2", 7000], ["10.0.0.2", 7001]]
    before = Commit(epoch=3, homes={"0": "a", "1": "a"}, addresses={"0": a[0], "1": a[1]},
                    hosts={"a": a, "b": b})
    layout = EpochLayout(epoch=4, version=1, moves=(Move(5, 0, 2), Move(6, 1, 3)),
                         live=frozenset({0, 1, 2, 3}), incoming={2: (5,), 3: (6,)},
                         outgoing={0: ((5, 2),), 1: ((6, 3),)}, drops={}, partitions=4)
    assert new_homes(layout, before) == {2: PlannedHome("b", ("10.0.0.2", 7000)),
                                         3: PlannedHome("b", ("10.0.0.2", 7001))}
    per_worker = {0: WorkerMetrics(host="a", address=a[0], service=[2, *a[0]]),
                  1: WorkerMetrics(host="a", address=a[1], service=[2, *a[1]]),
                  2: WorkerMetrics(host="a", remote=True, service=[2, *a[0]]),
                  3: WorkerMetrics(host="a", home_unreachable=True, address=a[1],
                                   service=[2, *a[1]])}
    done = commit_record(layout, StreamPosition(), [], per_worker, before)
    assert done.worker_homes() == {0: "a", 1: "a", 2: "b", 3: "a"}
    assert done.addresses == {"0": a[0], "1": a[1], "2": b[0], "3": a[1]}
    assert done.hosts == {"a": a}
    monkeypatch.setenv("MEGAPHONE_PLACEMENT", "0")  # the bench's baseline: homed where it ran
    assert new_homes(layout, before) == {}
    assert commit_record(layout, StreamPosition(), [], per_worker, before).homes["2"] == "a"


def test_a_new_worker_homed_through_a_sibling_keeps_the_address_its_task_reached(monkeypatch):
    """Only host b's service for shard 0 is known: worker 3 (shard 1) is still homed on b, its
    spec names that service and the shard to ask it for, and the commit record keeps the
    address of b's shard 1 service that its task reached, never the sibling's for worker 3."""
    from megaphone.migrator.epoch.routing_operator import EpochLayout, commit_record, new_homes
    from megaphone.migrator.statedir.commit import StreamPosition
    from megaphone.records import WorkerMetrics
    from megaphone.routing.table import Move

    monkeypatch.delenv("MEGAPHONE_PLACEMENT", raising=False)
    a, b = [["10.0.0.1", 7000], ["10.0.0.1", 7001]], [["10.0.0.2", 7000], ["10.0.0.2", 7001]]
    before = Commit(epoch=3, homes={"0": "a", "1": "a"}, addresses={"0": a[0], "1": a[1]},
                    hosts={"a": a, "b": [b[0], None]})
    layout = EpochLayout(epoch=4, version=1, moves=(Move(5, 0, 2), Move(6, 1, 3)),
                         live=frozenset({0, 1, 2, 3}), incoming={2: (5,), 3: (6,)},
                         outgoing={0: ((5, 2),), 1: ((6, 3),)}, drops={}, partitions=4)
    assert new_homes(layout, before) == {2: PlannedHome("b", ("10.0.0.2", 7000)),
                                         3: PlannedHome("b", ("10.0.0.2", 7000), 1)}
    per_worker = {0: WorkerMetrics(host="a", address=a[0], service=[2, *a[0]]),
                  1: WorkerMetrics(host="a", address=a[1], service=[2, *a[1]]),
                  2: WorkerMetrics(host="a", remote=True, address=b[0], service=[2, *a[0]]),
                  3: WorkerMetrics(host="a", remote=True, address=b[1], service=[2, *a[1]])}
    done = commit_record(layout, StreamPosition(), [], per_worker, before)
    assert done.worker_homes() == {0: "a", 1: "a", 2: "b", 3: "b"}
    assert done.addresses == {"0": a[0], "1": a[1], "2": b[0], "3": b[1]}
    # A task that did not report the address it reached leaves it unknown (the next task
    # that uses the store at home reports it), rather than the sibling's.
    per_worker[3] = WorkerMetrics(host="a", remote=True, service=[2, *a[1]])
    assert "3" not in commit_record(layout, StreamPosition(), [], per_worker, before).addresses


def test_a_commit_record_keeps_homes_and_reads_older_records_without_them():
    old = Commit.from_dict({"epoch": 3, "state_version": 1, "tokens": {"0": "t"}})
    assert old.homes == {} and old.worker_homes() == {} and old.hosts == {}
    new = Commit(epoch=4, homes={"0": "a-0123abcd", "1": "b-0123abcd"},
                 hosts={"a-0123abcd": [["10.0.0.1", 7000], None]})
    again = Commit.from_dict(new.to_dict())
    assert again == new and again.worker_homes() == {0: "a-0123abcd", 1: "b-0123abcd"}
    with pytest.raises(ValueError, match="homes must map workers to strings"):
        Commit.from_dict({"epoch": 1, "homes": {"w0": "a"}})
    with pytest.raises(ValueError, match="hosts must map host ids"):
        Commit.from_dict({"epoch": 1, "hosts": {"a": [["10.0.0.1", "7000"]]}})


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
        # A local master: its one host has the master's task slots.
        local_slots = spark.sparkContext.defaultParallelism
        assert pipe.state_dir.read_commit().slots == {here: local_slots}
        assert pipe.host_slots() == {here: local_slots}
    finally:
        pipe.close()
    with pytest.raises(ValueError, match="slots_per_host must be a positive int"):
        Pipeline(spark, str(tmp_path / "state"), key="k", num_bins=16, local_dir=local,
                 slots_per_host=0)
    pipe = Pipeline(spark, str(tmp_path / "state"), key="k", update="count", num_bins=16,
                    local_dir=local, slots_per_host=local_slots + 1)
    try:  # the setting overrides what the master says
        pipe.process(spark.createDataFrame([(1,)], "k long"))
        assert pipe.host_slots() == {here: local_slots + 1}
    finally:
        pipe.close()
    info = describe(str(tmp_path / "state"))
    assert info["homes"] == {"0": here, "1": here} and info["away"] == []
    assert info["hosts"] == {here: 2}
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
        # The host's services for both workers' shards are known, to home new workers on.
        services = pipe.state_dir.read_commit().hosts[host_id(local)]
        assert services and all(s is not None for s in services[:2])
    finally:
        pipe.close()
