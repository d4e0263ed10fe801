"""A training job whose process stops making progress (SIGSTOP, a cgroup freezer, a debugger, a hang in D state) is
told apart from one that computes between two progress reports: it is stalled once it has reported nothing and used no
CPU time for ``training.stall_warning_s``. Its status says since when (``stalled_s``, ``last_progress_at``), one
WARNING names it with its process's state, the gauge ``cerebellar_norse_training_job_stalled`` is 1, and a DELETE ends
it. Real processes, stopped and continued with real signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from training_helpers import ConfigFactory

from cerebellar_norse.training.jobs import JobManager, JobStatus
from cerebellar_norse.training.stall import CHECK_EVERY_S, StallWatch, process_activity

STALL_S = 1.5  # training.stall_warning_s of these tests


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def until(what: Callable[[], bool], limit_s: float = 20.0) -> None:
    deadline = time.monotonic() + limit_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def busy_job(make_config: ConfigFactory) -> tuple[JobManager, Any, Any, Any]:
    """A job manager with ``training.stall_warning_s`` = STALL_S, a spawn context, a report queue and a started process
    that computes (uses CPU time) and never reports: the manager's job process in the tests below."""
    mgr = JobManager(make_config(training={"stall_warning_s": STALL_S}), lambda version: None, lambda loss: None)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=sum, args=(range(10**13),), daemon=True)
    proc.start()
    return mgr, ctx, out, proc


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_a_stopped_job_is_said_stalled_a_computing_one_is_not_and_a_delete_ends_it(
        make_config: ConfigFactory, caplog: pytest.LogCaptureFixture) -> None:
    from cerebellar_norse.training import jobs

    # a job process computing between two progress reports (an epoch's validation pass): CPU time, no report
    mgr, ctx, out, proc = busy_job(make_config)
    saved = jobs.KILL_GRACE_S

    async def scenario() -> None:
        job = mgr.jobs["stall1"] = JobStatus(job_id="stall1", state="running", files=["t.csv"], epoch=1,
                                             started=time.time(), last_progress_at=time.time())
        mgr.latest, mgr._proc, mgr._stop = "stall1", proc, ctx.Event()
        mgr._watch = StallWatch("stall1", time.monotonic())
        monitor = asyncio.create_task(mgr._monitor(job, out, "never"))
        await asyncio.sleep(3 * STALL_S)  # silent, but computing: not stalled
        assert job.stalled_s is None and not mgr.stalled and job.as_dict()["stalled_s"] is None
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []

        os.kill(proc.pid, signal.SIGSTOP)
        await until(lambda: job.stalled_s is not None)
        assert job.stalled_s is not None and job.stalled_s >= STALL_S and mgr.stalled
        status = job.as_dict()
        assert status["state"] == "running" and status["stalled_s"] >= STALL_S
        assert status["last_progress_at"] is not None and status["last_progress_at"].endswith("Z")
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and warned[0].startswith("training job stall1 is stalled: no progress and no CPU time"), warned
        assert f"its process {proc.pid} is stopped" in warned[0] and "DELETE /training/stall1" in warned[0]
        await asyncio.sleep(2 * CHECK_EVERY_S)
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1  # said once per stall

        os.kill(proc.pid, signal.SIGCONT)  # continued: computing again
        await until(lambda: job.stalled_s is None)
        assert not mgr.stalled
        assert any("training job stall1 makes progress again after" in r.getMessage() for r in caplog.records)

        os.kill(proc.pid, signal.SIGSTOP)  # stopped again; the operator ends it
        await until(lambda: job.stalled_s is not None)
        ended = (await asyncio.wait_for(mgr.cancel("stall1"), 30)).as_dict()
        assert ended["state"] == "cancelled" and ended["stalled_s"] is None and not mgr.stalled
        assert not proc.is_alive() and proc.exitcode == -signal.SIGKILL
        monitor.cancel()

    try:
        jobs.KILL_GRACE_S = 0.5
        with caplog.at_level(logging.INFO, logger="cerebellar_norse.training"):
            asyncio.run(scenario())
    finally:
        jobs.KILL_GRACE_S = saved
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.join()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_the_activity_of_a_process_is_its_cpu_time_and_state() -> None:
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=sum, args=(range(10**13),), daemon=True)
    proc.start()
    try:
        first = process_activity(proc.pid)
        time.sleep(1.0)
        second = process_activity(proc.pid)
        assert first is not None and second is not None and second[0] > first[0] and second[1] in "RS"
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while state_of(proc.pid) != "T":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stopped = process_activity(proc.pid)
        time.sleep(0.5)
        assert stopped is not None and stopped[1] == "T" and process_activity(proc.pid) == stopped
    finally:
        proc.kill()
        proc.join()
    assert process_activity(proc.pid) is None  # gone (reaped)


FREEZER_V1 = Path("/sys/fs/cgroup/freezer")


def freezer_or_skip(tmp_name: str) -> Path:
    """A new cgroup v1 freezer group (its tasks frozen show in D state, and a SIGKILL waits for the thaw); skips where
    there is none or it may not be made (no root, cgroup v2 only)."""
    if not (FREEZER_V1 / "freezer.state").exists() and not (FREEZER_V1 / "tasks").exists():
        pytest.skip("no cgroup v1 freezer here")
    group = FREEZER_V1 / tmp_name
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a freezer cgroup: {exc}")
    return group


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_a_job_hung_in_d_state_is_said_stalled_and_a_delete_records_it_cancelled_and_says_its_process_lingers(
        make_config: ConfigFactory, caplog: pytest.LogCaptureFixture) -> None:
    """A process frozen by the cgroup v1 freezer is in D state (as one hung on a dead mount): it uses no CPU time and
    even SIGKILL waits for the thaw. The job is stalled, its WARNING says D state; a DELETE records it cancelled (the
    next job may start) and one WARNING says the process ends when its wait does; thawed, it dies of the SIGKILL."""
    from cerebellar_norse.training import jobs

    group = freezer_or_skip(f"cerebellar-norse-test-{os.getpid()}")
    mgr, ctx, out, proc = busy_job(make_config)
    saved = (jobs.KILL_GRACE_S, jobs.CANCEL_GRACE_S)

    async def scenario() -> None:
        job = mgr.jobs["hung1"] = JobStatus(job_id="hung1", state="running", files=["t.csv"], epoch=1,
                                            started=time.time(), last_progress_at=time.time())
        mgr.latest, mgr._proc, mgr._stop = "hung1", proc, ctx.Event()
        mgr._watch = StallWatch("hung1", time.monotonic())
        monitor = asyncio.create_task(mgr._monitor(job, out, "never"))
        (group / "cgroup.procs").write_text(str(proc.pid))
        (group / "freezer.state").write_text("FROZEN")
        await until(lambda: state_of(proc.pid) == "D")
        await until(lambda: job.stalled_s is not None)
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and "is in an uninterruptible wait (D state" in warned[0], warned
        ended = (await asyncio.wait_for(mgr.cancel("hung1"), 30)).as_dict()
        assert ended["state"] == "cancelled" and not mgr.busy and not mgr.stalled
        assert proc.is_alive() and state_of(proc.pid) == "D"  # the kernel holds it until the thaw
        lingering = [r.getMessage() for r in caplog.records if "after SIGKILL either" in r.getMessage()]
        assert len(lingering) == 1 and f"training job process {proc.pid} did not end" in lingering[0], lingering
        assert "uninterruptible wait" in lingering[0] and "can write no model" in lingering[0]
        await asyncio.wait_for(mgr.close(), 30)  # a stop now: it does not end it, nor say so, all over again
        said = [r.getMessage() for r in caplog.records if "did not end" in r.getMessage()]
        assert proc.is_alive() and len(said) == 2, said  # once after SIGTERM, once after SIGKILL: by the cancel
        monitor.cancel()

    try:
        jobs.KILL_GRACE_S, jobs.CANCEL_GRACE_S = 0.5, 0.2
        with caplog.at_level(logging.INFO, logger="cerebellar_norse.training"):
            asyncio.run(scenario())
        (group / "freezer.state").write_text("THAWED")
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL  # the SIGKILL waited for the thaw: no user code ran after the cancel
    finally:
        jobs.KILL_GRACE_S, jobs.CANCEL_GRACE_S = saved
        (group / "freezer.state").write_text("THAWED")
        if proc.is_alive():
            proc.kill()
            proc.join()
        group.rmdir()


def job_process_of(service_pid: int) -> int:
    """The pid of the service's training job process."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == service_pid and b"cerebellar_norse.training.jobprocess" in cmdline:
            return int(entry.name)
    raise AssertionError("no job process")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_a_stopped_job_of_a_live_service_shows_in_its_status_and_metrics_and_a_delete_ends_it(tmp_path: Path) -> None:
    import httpx
    from training_helpers import start

    from cerebellar_norse.synthetic import generate_ticks
    from cerebellar_norse.training.data import write_csv

    data = tmp_path / "data"
    write_csv(data / "ticks.csv", generate_ticks(20000, 2, seed=3))
    srv = start(tmp_path / "state", tmp_path / "server.log", {"CEREBELLAR_NORSE_PATHS__DATA_DIR": str(data),
                                                             "CEREBELLAR_NORSE_TRAINING__STALL_WARNING_S": "2"})
    pid = 0
    try:
        with httpx.Client(base_url=srv.url, timeout=30.0) as c:
            r = c.post("/training", json={"files": ["ticks.csv"], "epochs": 200, "activate": "never"})
            assert r.status_code == 202, r.text
            job_id = r.json()["job_id"]

            def status() -> dict[str, object]:
                got = c.get(f"/training/status/{job_id}")
                assert got.status_code == 200, got.text
                answer: dict[str, object] = got.json()
                return answer

            def gauge() -> float:
                m = re.search(r"^cerebellar_norse_training_job_stalled (\S+)$", c.get("/metrics").text, re.M)
                assert m is not None
                return float(m[1])

            deadline = time.monotonic() + 120
            while float(status()["progress"]) <= 0:  # type: ignore[arg-type]
                assert time.monotonic() < deadline, status()
                time.sleep(0.2)
            st = status()
            assert st["state"] == "running" and st["stalled_s"] is None and isinstance(st["last_progress_at"], str)
            assert gauge() == 0.0
            pid = job_process_of(srv.proc.pid)
            os.kill(pid, signal.SIGSTOP)
            deadline = time.monotonic() + 30
            while status()["stalled_s"] is None:
                assert time.monotonic() < deadline, status()
                time.sleep(0.2)
            st = status()
            assert st["state"] == "running" and float(st["stalled_s"]) >= 2.0  # type: ignore[arg-type]
            assert gauge() == 1.0
            assert c.post("/training", json={"files": ["ticks.csv"], "epochs": 1}).status_code == 409
            ended = c.delete(f"/training/{job_id}")
            assert ended.status_code == 200 and ended.json()["state"] == "cancelled", ended.text
            assert ended.json()["stalled_s"] is None and gauge() == 0.0
            assert not Path(f"/proc/{pid}").exists() or state_of(pid) == "Z"
        assert f"training job {job_id} is stalled: no progress and no CPU time for" in srv.log()
    finally:
        if pid and Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        rc = srv.stop()
    assert rc == 0, srv.log()[-3000:]


def test_the_last_progress_time_of_a_finished_job_is_read_back_after_a_restart(make_config: ConfigFactory) -> None:
    cfg = make_config()
    mgr = JobManager(cfg, lambda version: None, lambda loss: None)
    job = mgr.jobs["done1"] = JobStatus(job_id="done1", state="running", files=["t.csv"], started=1_790_000_000.0,
                                        last_progress_at=1_790_000_321.0)
    mgr._finish(job, "succeeded", None)
    again = JobManager(cfg, lambda version: None, lambda loss: None).get("done1").as_dict()
    assert again["last_progress_at"] == "2026-09-21T14:18:41Z" and again["stalled_s"] is None
