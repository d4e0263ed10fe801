"""A training job started after the installed package changed on disk (an upgrade without a restart) says so.

The job process runs the code on disk, not the service's: after an upgrade under a running service its entry point
may no longer fit what the service sends, and the job failed as "training process exited with code 1" with a
traceback on stderr only. The process compares the package's fingerprint with the one the service started with.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cerebellar_norse.training import jobprocess
from cerebellar_norse.training.jobprocess import PACKAGE_CHANGED, package_fingerprint, start_job_process

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
    proc, out, stop = start_job_process(target, ("v1",))
    try:
        assert _reports(out) == [("succeeded", {"model_version": "v1"})]
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        out.close()
        stop.close()


def test_a_job_after_the_package_changed_fails_naming_the_restart(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobprocess, "STARTED_WITH", "1:1")  # the service started with other files
    proc, out, stop = start_job_process(target, ("v1",))
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
