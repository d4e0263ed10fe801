"""``training_loss``: no sample until a loss is known, then the latest; at start, the last job's or the served model's.

A gauge at 0 before any training would read as a perfect loss, and its jump to the first
real loss as a rising one (the shipped alert is ``deriv(training_loss[10m]) > 0``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest

from cerebellar_norse.api.server import build_service
from cerebellar_norse.config import Config, load_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.observability.metrics import ServiceMetrics
from cerebellar_norse.training.checkpoints import ModelStore

SAMPLE = re.compile(r"^training_loss ([0-9.eE+-]+)$", re.M)


def scraped(metrics: ServiceMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_no_sample_until_a_loss_is_set() -> None:
    m = ServiceMetrics()
    text = scraped(m)
    assert "# TYPE training_loss gauge" in text and SAMPLE.search(text) is None
    m.training_loss.set(1.25)
    assert SAMPLE.findall(scraped(m)) == ["1.25"]


def _config(state: Path) -> Config:
    return load_config(None, environ={"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(state),
                                      "CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN": "false"})


def test_at_start_the_served_model_s_last_epoch_loss_then_the_latest_job_s(tmp_path: Path) -> None:
    cfg = _config(tmp_path / "state")
    assert SAMPLE.search(scraped(build_service(cfg).metrics)) is None  # untrained network, no job: unknown

    store = ModelStore(tmp_path / "state")
    history = [{"epoch": 1, "train_loss": 1.09}, {"epoch": 2, "train_loss": 1.07}]
    store.set_active(store.save(generate_weights(cfg), cfg, {"validation": {"loss": 1.0}, "history": history}))
    assert SAMPLE.findall(scraped(build_service(cfg).metrics)) == ["1.07"]

    jobs = tmp_path / "state" / "jobs"
    jobs.mkdir()
    (jobs / "j1.json").write_text(json.dumps({"job_id": "j1", "state": "succeeded", "loss": 0.98,
                                              "created": "2026-11-25T10:00:00Z"}))
    assert SAMPLE.findall(scraped(build_service(cfg).metrics)) == ["0.98"]


def test_a_restart_keeps_the_loss_when_the_latest_job_failed_before_any_step(tmp_path: Path) -> None:
    """A job that failed on its file set no loss, so the gauge kept the previous job's; a restart showed the served
    model's older (higher) loss instead: a rise of training_loss that no training made (deriv() > 0, the convergence
    alert pending)."""
    cfg = _config(tmp_path / "state")
    store = ModelStore(tmp_path / "state")
    history = [{"epoch": 1, "train_loss": 1.09}]
    store.set_active(store.save(generate_weights(cfg), cfg, {"validation": {"loss": 1.0}, "history": history}))
    jobs = tmp_path / "state" / "jobs"
    jobs.mkdir()
    (jobs / "ok.json").write_text(json.dumps({"job_id": "ok", "state": "succeeded", "loss": 1.02,
                                              "created": "2026-11-25T10:00:00Z"}))
    (jobs / "bad.json").write_text(json.dumps({"job_id": "bad", "state": "failed", "error": "no price column",
                                               "created": "2026-11-25T11:00:00Z"}))
    assert SAMPLE.findall(scraped(build_service(cfg).metrics)) == ["1.02"]


def test_during_a_job_the_loss_is_the_epoch_s_mean_so_far(tmp_path: Path) -> None:
    """Each step's loss is one mini-batch's, which goes up and down with the data it holds, and an epoch's end gave
    the epoch's mean, a jump from the last step's: deriv(training_loss) of a converging job could stay above 0 (the
    convergence alert). The gauge and the job's loss are the epoch's mean so far: at its end, the epoch's mean."""
    from cerebellar_norse.training.jobs import JobManager, JobStatus

    gauge: list[float] = []
    mgr = JobManager(_config(tmp_path / "state"), lambda version: None, gauge.append)
    job = JobStatus(job_id="j1", state="running")
    seen = []
    for epoch, losses in ((1, [1.2, 1.0, 0.8]), (2, [0.9, 1.1])):
        for step, loss in enumerate(losses, 1):
            mgr._on_progress(job, {"epoch": epoch, "epochs": 2, "step": step, "steps": len(losses), "loss": loss})
            seen.append(job.loss)
        mean = sum(losses) / len(losses)
        mgr._on_progress(job, {"epoch": epoch, "epochs": 2, "step": len(losses), "steps": len(losses), "loss": mean,
                               "validation": None, "epoch_done": True})
        seen.append(job.loss)
    expected = [1.2, 1.1, 1.0, 1.0, 0.9, 1.0, 1.0]
    assert seen == gauge and [round(x, 9) for x in gauge] == expected, gauge
