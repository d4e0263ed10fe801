"""A training job started after the installed package changed on disk (an upgrade without a restart) says so.

The job process runs the code on disk, not the service's: after an upgrade under a running service its entry point
may no longer fit what the service sends, and the job failed as "training process exited with code 1" with a
traceback on stderr only. The process compares the package's fingerprint with the one the service started with.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from training_helpers import ConfigFactory

from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training import jobprocess
from cerebellar_norse.training.data import write_csv
from cerebellar_norse.training.jobprocess import (
    PACKAGE_CHANGED,
    package_at_start,
    package_fingerprint,
    start_job_process,
)
from cerebellar_norse.training.jobs import FINAL, JobManager, JobStatus, TrainingRequest

REPORTS_DONE = """
def job(out, stop, word):
    out.put(("succeeded", {"model_version": word}))
"""


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "reports_done.py").write_text(REPORTS_DONE)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])  # (the job process takes this sys.path)
    return "reports_done:job"


def _reports(out: jobprocess.ReportReader) -> list[object]:
    got = []
    try:
        while True:
            got.append(out.get(timeout=60))
    except EOFError:
        return got


def test_a_job_runs_when_the_package_is_as_the_service_started_with_it(target: str) -> None:
    proc, out, stop = start_job_process(target, ("v1",), package_at_start())
    try:
        assert _reports(out) == [("succeeded", {"model_version": "v1"})]
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        out.close()
        stop.close()


def test_a_job_after_the_package_changed_fails_naming_the_restart(target: str) -> None:
    proc, out, stop = start_job_process(target, ("v1",), "1:1")  # the service started with other files
    try:
        assert _reports(out) == [("failed", {"error": PACKAGE_CHANGED})]
        proc.join(60)
        assert proc.exitcode == 1
    finally:
        out.close()
        stop.close()
    assert "restart the service" in PACKAGE_CHANGED


def test_the_fingerprint_changes_when_a_file_is_replaced(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    os.utime(pkg / "a.py", ns=(1_000_000_000, 1_000_000_000))
    os.utime(pkg / "sub" / "b.py", ns=(2_000_000_000, 2_000_000_000))
    before = package_fingerprint(pkg)
    assert before == "2:2000000000"
    (pkg / "a.py").write_text("x = 3\n")  # as pip replaces a file
    assert package_fingerprint(pkg) != before
    (pkg / "c.py").write_text("")
    assert package_fingerprint(pkg).startswith("3:")
    assert package_fingerprint(tmp_path / "missing") == "0:0"


def test_the_job_manager_gives_its_jobs_the_package_it_started_with(make_config: ConfigFactory, tmp_path: Path) -> None:
    """The service's job manager passes the fingerprint taken when it was built: a job started after the files
    changed (here: a manager that started with other files) fails naming the restart, and no model is written."""
    write_csv(tmp_path / "data" / "small.csv", generate_ticks(600, 1, seed=1))
    mgr = JobManager(make_config(data_dir=tmp_path / "data"), lambda version: None, lambda loss: None)
    assert mgr._package == package_fingerprint()  # the files as they are: jobs run
    mgr._package = "1:1"

    async def scenario() -> JobStatus:
        try:
            job = mgr.start(TrainingRequest(files=["small.csv"]))
            for _ in range(600):
                if job.state in FINAL:
                    break
                await asyncio.sleep(0.1)
            return job
        finally:
            await mgr.close()

    job = asyncio.run(scenario())
    assert job.state == "failed" and job.error == PACKAGE_CHANGED and job.model_version is None
