"""training.keep_job_records: the records of finished jobs (jobs/<job_id>.json and memory) stay bounded."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pytest
from training_helpers import ConfigFactory

from cerebellar_norse.errors import JobNotFoundError
from cerebellar_norse.training.jobs import JobManager, JobStatus


def manager(make_config: ConfigFactory, keep: int) -> JobManager:
    return JobManager(make_config(training={"keep_job_records": keep}), lambda version: None, lambda loss: None)


def run_job(mgr: JobManager, job_id: str, state: str = "succeeded") -> JobStatus:
    """A job as start() records it, then ended as _monitor ends it."""
    job = JobStatus(job_id=job_id, state="running", files=["t.csv"])
    mgr.jobs[job_id] = job
    mgr.latest = job_id
    mgr._write_record(job)
    mgr._finish(job, state, None if state == "succeeded" else "boom")  # type: ignore[arg-type]
    return job


def on_disk(mgr: JobManager) -> set[str]:
    return {p.stem for p in mgr.jobs_dir.glob("*.json")}


def test_records_of_a_job_every_few_minutes_stay_bounded_in_memory_and_on_disk(make_config: ConfigFactory) -> None:
    """Every finished job's record was kept for good, on disk and in memory (and all read at each start)."""
    mgr = manager(make_config, 5)
    for i in range(300):
        run_job(mgr, f"job{i:04d}", "succeeded" if i % 3 else "cancelled")
        assert len(mgr.jobs) <= 5 and len(on_disk(mgr)) <= 5
    newest = [f"job{i:04d}" for i in range(295, 300)]
    assert list(mgr.jobs) == newest and on_disk(mgr) == set(newest)
    assert mgr.get("latest").job_id == "job0299"
    with pytest.raises(JobNotFoundError):
        mgr.get("job0000")
    again = manager(make_config, 5)
    assert list(again.jobs) == newest and again.latest == "job0299"


def test_a_start_deletes_the_oldest_records_beyond_the_limit(make_config: ConfigFactory) -> None:
    cfg = make_config(training={"keep_job_records": 3})
    jobs = Path(cfg.paths.state_dir) / "jobs"
    jobs.mkdir(parents=True)
    for i in range(10):  # ids in another order than their times: the newest by time are kept
        job_id = f"{(7 * i) % 10:04x}"
        (jobs / f"{job_id}.json").write_text(json.dumps({"job_id": job_id, "state": "failed",
                                                         "created": f"2026-11-25T10:{i:02d}:00Z"}))
    mgr = JobManager(cfg, lambda version: None, lambda loss: None)
    kept = [f"{(7 * i) % 10:04x}" for i in (7, 8, 9)]
    assert list(mgr.jobs) == kept and {p.stem for p in jobs.glob("*.json")} == set(kept)
    assert mgr.latest == kept[-1]


def test_a_running_job_is_never_dropped(make_config: ConfigFactory) -> None:
    mgr = manager(make_config, 1)
    running = JobStatus(job_id="run1", state="running", files=["t.csv"])
    mgr.jobs["run1"] = running
    mgr._write_record(running)
    run_job(mgr, "done1")  # latest now, and the limit is 1: only a finished job other than the latest may go
    run_job(mgr, "done2")
    assert list(mgr.jobs) == ["run1", "done2"] and mgr.get("run1").state == "running"


def test_a_record_that_cannot_be_deleted_is_kept_and_said(make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    mgr = manager(make_config, 1)
    run_job(mgr, "old1")
    real = Path.unlink

    def refused(self: Path, missing_ok: bool = False) -> None:
        if self.name == "old1.json":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        real(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refused)
    with caplog.at_level(logging.WARNING, logger="cerebellar_norse.training"):
        run_job(mgr, "new1")
    assert list(mgr.jobs) == ["old1", "new1"] and on_disk(mgr) == {"old1", "new1"}
    assert f"cannot delete the record {mgr.jobs_dir / 'old1.json'} of an old training job" in caplog.text
    monkeypatch.undo()
    run_job(mgr, "new2")  # tried again when the next job ends
    assert list(mgr.jobs) == ["new2"] and on_disk(mgr) == {"new2"}
