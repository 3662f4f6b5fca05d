"""Guard rails of a state directory: each refusal has its own message and changes nothing."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from megaphone import Pipeline
from megaphone.migrator.statedir.directory import NotAStateDir, StateDirLocked
from megaphone.routing.fingerprint import FingerprintMismatch

ROOT = Path(__file__).resolve().parents[1]


def snapshot(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def state_dir(spark, tmp_path_factory):
    """A closed state directory with a few committed epochs (rocksdb, int keys, 16 bins)."""
    path = tmp_path_factory.mktemp("guard") / "state"
    pipe = Pipeline(spark, str(path), key="k", update="count", workers=2, num_bins=16,
                    key_type="int64", pipeline_id=uuid.uuid4().hex)
    for _ in range(2):
        pipe.process(spark.createDataFrame([(k,) for k in range(30)], "k long"))
    pipe.close()
    return path


@pytest.fixture
def copy(state_dir, tmp_path):
    target = tmp_path / "state"
    shutil.copytree(state_dir, target)
    return target


def open_pipe(spark, path, **kw):
    args = {"key": "k", "update": "count", "num_bins": 16, **kw}
    return Pipeline(spark, str(path), **args)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"num_bins": 32}, "num_bins 32 != 16"),
        ({"key_type": "str"}, "key_type 'str' != 'int64'"),
        ({"pipeline_id": "someone-else"}, "pipeline_id 'someone-else' != "),
        ({"update": "sum", "value": "v"}, "update 'sum' != 'count'"),
        ({"backend": "memory"}, "backend 'memory' != 'rocksdb'"),
    ],
)
def test_another_pipeline_configuration_is_refused(spark, copy, kw, message):
    before = snapshot(copy)
    with pytest.raises(ValueError, match=message):
        open_pipe(spark, copy, **kw)
    assert snapshot(copy) == before


def test_the_lock_holder_removes_half_written_files_a_killed_driver_left(copy):
    """A driver killed inside an atomic write leaves its temporary file behind; the next lock
    holder deletes it (nothing else writes there) and keeps every real file."""
    from megaphone.migrator.statedir.directory import StateDir

    before = snapshot(copy)
    torn = [copy / ".commit.json.k1l2e3d4.tmp", copy / "outputs" / ".e000000001.arrow.x9.tmp"]
    for path in torn:
        path.write_bytes(b"half")
    state = StateDir.open(copy).lock()
    try:
        assert not any(path.exists() for path in torn)
        assert snapshot(copy) == before
    finally:
        state.unlock()


def test_a_second_opener_is_refused_in_process_and_from_another_process(spark, copy):
    pipe = open_pipe(spark, copy)
    try:
        with pytest.raises(StateDirLocked, match="in use by another pipeline"):
            open_pipe(spark, copy)
        probe = ("from megaphone.migrator.statedir.directory import StateDir; import sys; "
                 f"StateDir.open({str(copy)!r}).lock()")
        result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode != 0 and "in use by another pipeline" in result.stderr
    finally:
        pipe.close()
    open_pipe(spark, copy).close()  # released on close


@pytest.mark.parametrize(
    ("damage", "error", "message"),
    [
        (lambda p: (p / "commit.json").write_text('{"epoch": 1, "state_ver'),
         ValueError, r"commit record at .*commit.json is corrupt"),
        (lambda p: (p / "megaphone.json").write_text("{"), NotAStateDir, "corrupt"),
        (lambda p: (p / "routing.json").write_text("[]"), ValueError, "not a megaphone routing"),
        (lambda p: shutil.rmtree(p / "workers" / "w00001"), ValueError,
         r"worker directories missing for workers \[1\]"),
        (lambda p: (p / "commit.json").write_text(
            (p / "commit.json").read_text().replace('"epoch":1', '"epoch":3')),
         ValueError, "worker 0 state is at epoch 1, but the last commit is epoch 3"),
        (lambda p: (p / "commit.json").write_text(
            (p / "commit.json").read_text().replace('"epoch":1', '"epoch":-1')),
         ValueError, "past the last commit .* without undo records"),
        (lambda p: (p / "routing.json").write_text(
            (p / "routing.json").read_text().replace('"num_bins":16', '"num_bins":32')),
         FingerprintMismatch, "routing table belongs to another pipeline"),
    ],
)
def test_damage_is_reported_precisely_and_not_repaired(spark, copy, damage, error, message):
    damage(copy)
    before = snapshot(copy)
    with pytest.raises(error, match=message):
        open_pipe(spark, copy)
    assert snapshot(copy) == before


def test_not_a_state_dir(spark, tmp_path):
    with pytest.raises(NotAStateDir, match=r"has no megaphone\.json"):
        from megaphone.migrator.statedir.directory import StateDir

        StateDir.open(tmp_path)


def test_outputs_are_kept_for_the_last_epochs_only(spark, tmp_path):
    pipe = Pipeline(spark, str(tmp_path / "s"), key="k", update="count", num_bins=16,
                    key_type="int64", keep_outputs=2, pipeline_id=uuid.uuid4().hex)
    for _ in range(4):
        pipe.process(spark.createDataFrame([(1,)], "k long"))
    kept = sorted(p.name for p in (tmp_path / "s" / "outputs").iterdir())
    assert kept == ["e000000002.arrow", "e000000003.arrow"]
    assert pipe.state_dir.read_outputs(3).to_pylist() == [{"k": 1, "count": 4}]
    with pytest.raises(ValueError, match="no longer kept"):
        pipe.state_dir.read_outputs(1)
    (tmp_path / "s" / "outputs" / "e000000002.arrow").write_bytes(b"torn")
    with pytest.raises(ValueError, match="corrupt"):
        pipe.state_dir.read_outputs(2)
    pipe.close()
