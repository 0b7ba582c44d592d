"""The job's run files (onceflow.runtime.run_files): typed records, one writer and one reader each. A file read back
is the record written; a key the record does not know is ignored; a file of another shape reads as none; a
change naming a field the status does not have fails instead of writing a stray key."""

import json

import pytest

from onceflow import wire
from onceflow.runtime.run_files import Desired, Exited, JobStatus, StandbyGo, StandbyReady, read_json


def test_the_status_file_reads_back_as_written_with_its_types(tmp_path):
    path = tmp_path / "run" / "a.status.json"
    st = JobStatus(app="a", pid=42, started_ms=1000).updated(
        state=wire.JobState.RUNNING, last_batch=7, end_offsets={"0": 10, "3": 20}, last_timings={"txn_ms": 5}
    )
    st.write(path)
    got = JobStatus.read(path)
    assert got == st
    assert got is not None and got.state is wire.JobState.RUNNING and got.end_offsets == {"0": 10, "3": 20}
    assert json.loads(path.read_text())["end_offsets"] == {"0": 10, "3": 20}  # position keys (rules.sources)
    several = st.updated(end_offsets={"a:0": 10, "b:3": 20})  # several source topics: `topic:partition` keys
    several.write(path)
    assert JobStatus.read(path) == several and json.loads(path.read_text())["end_offsets"] == {"a:0": 10, "b:3": 20}
    assert not list(path.parent.glob("*.tmp")), "replaced atomically: no temporary file left"


def test_a_status_change_must_name_a_field_of_the_status():
    with pytest.raises(TypeError):
        JobStatus(app="a", pid=1, started_ms=1).updated(last_bacth=3)


def test_unknown_keys_are_ignored_and_files_of_another_shape_read_as_none(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"app": "a", "pid": 1, "started_ms": 5, "state": "running", "written_by": "newer"}))
    got = JobStatus.read(path)
    assert got is not None and (got.app, got.state) == ("a", wire.JobState.RUNNING)
    for text in (
        "[1, 2]",
        "{not json",
        json.dumps({"app": "a"}),
        json.dumps({"app": "a", "pid": 1, "started_ms": 1, "state": "exploded"}),
    ):
        path.write_text(text)
        assert JobStatus.read(path) is None, text
    assert JobStatus.read(tmp_path / "missing.json") is None and read_json(tmp_path / "missing.json") is None


def test_the_small_run_files_round_trip(tmp_path):
    for rec in (
        Desired(state=wire.Intent.STOPPED, ts_ms=3),
        Exited(exit_code=wire.EXIT_FENCED, reason="fenced", ts_ms=4),
        StandbyReady(pgid=10, pid=11, ready_ms=5),
        StandbyGo(pgid=10, ts_ms=6),
    ):
        path = tmp_path / f"{type(rec).__name__}.json"
        rec.write(path)
        assert type(rec).read(path) == rec
    got = Desired.read(tmp_path / "Desired.json")
    assert got is not None and got.state is wire.Intent.STOPPED
