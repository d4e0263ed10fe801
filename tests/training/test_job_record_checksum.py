"""Job records (jobs/<job_id>.json) carry a SHA-256 of their fields: a record changed since it was written is seen
at start and by ``--verify-data``, not read back as the job's history."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from training_helpers import ConfigFactory

from cerebellar_norse.training.checkpoints import verify_tree
from cerebellar_norse.training.jobs import JobManager, JobStatus


def manager(make_config: ConfigFactory) -> JobManager:
    return JobManager(make_config(), lambda version: None, lambda loss: None)


def finished_job(mgr: JobManager, job_id: str) -> Path:
    """A job recorded as start() records it and ended as the monitor ends it; its record's path."""
    job = JobStatus(job_id=job_id, state="running", files=["t.csv"], epochs=5)
    mgr.jobs[job_id] = job
    mgr.latest = job_id
    mgr._write_record(job)
    job.epoch = 5
    mgr._finish(job, "succeeded", None)
    return mgr.jobs_dir / f"{job_id}.json"


def test_a_record_is_plain_json_with_its_checksum_and_reads_back(make_config: ConfigFactory) -> None:
    mgr = manager(make_config)
    path = finished_job(mgr, "ok1")
    on_disk = json.loads(path.read_text())
    assert (on_disk["state"], on_disk["epoch"], len(on_disk["sha256"])) == ("succeeded", 5, 64)
    again = manager(make_config)
    assert again.jobs["ok1"].as_dict() == mgr.jobs["ok1"].as_dict()
    ok, problems = verify_tree(mgr.jobs_dir.parent)
    assert not problems and f"{mgr.jobs_dir}: 1 job record OK" in ok


def test_a_record_changed_since_it_was_written_is_not_read_back(make_config: ConfigFactory,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """One digit of the record changed (bit rot, an edit): valid JSON of a valid job whose history is not the job's.
    Without the checksum it was read back as the job's."""
    mgr = manager(make_config)
    path = finished_job(mgr, "rot1")
    finished_job(mgr, "good1")
    text = path.read_text()
    assert text.count('"epoch": 5') == 1
    path.write_text(text.replace('"epoch": 5', '"epoch": 4'))
    before = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="cerebellar_norse"):
        again = manager(make_config)
    assert set(again.jobs) == {"good1"}
    assert any("ignoring unreadable job record" in r.getMessage() and str(path) in r.getMessage()
               and "checksum mismatch" in r.getMessage() for r in caplog.records)
    assert path.read_bytes() == before  # left as found, for the operator to look at
    ok, problems = verify_tree(mgr.jobs_dir.parent)
    assert [p for p in problems if str(path) in p] == [
        f"{path}: checksum mismatch: the file was changed or damaged since it was written: the service ignores this "
        "job record at start (WARNING), so that job's history is lost; delete the file"]
    assert f"{mgr.jobs_dir}: 1 job record OK" in ok


def test_records_written_before_checksums_are_still_read(make_config: ConfigFactory) -> None:
    mgr = manager(make_config)
    mgr.jobs_dir.mkdir(parents=True, exist_ok=True)
    (mgr.jobs_dir / "old1.json").write_text(json.dumps({"job_id": "old1", "state": "failed", "error": "boom",
                                                        "created": "2026-11-25T10:00:00Z"}))
    again = manager(make_config)
    assert (again.jobs["old1"].state, again.jobs["old1"].error) == ("failed", "boom")
    assert not verify_tree(mgr.jobs_dir.parent)[1]
