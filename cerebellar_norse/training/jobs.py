"""Training jobs: one at a time, each in its own process, reported to the service.

The job process limits itself to ``training.threads`` threads (torch, numba, BLAS),
so serving keeps its cores. It loads the CSV files, trains from the active model's
weights, evaluates the active model on the same held-out split, and writes the new
model directory atomically; progress goes to the service through a pipe (:mod:`.jobprocess`).

The job process dies with the service: on Linux the kernel kills it when the service
process ends (``PR_SET_PDEATHSIG``, asked for first thing, before its code is imported),
and a watchdog thread in it exits as soon as its parent is gone (any platform), so it
never writes a model for a service that is no longer there (:mod:`.jobprocess`). A job record is written when the job starts (``running``); a record
still ``running`` at the next start belonged to a service that died, and is marked
``failed``.

The service activates a succeeded job's model when its validation loss beats the
active model's on the same split (``training.auto_activate``), or as the job asked
(``activate``: ``auto``, ``always``, ``never``). Activation swaps the weights between
batches on the event loop, so no request sees a mix of old and new weights.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import gc
import logging
import math
import numbers
import os
import queue
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, WithJsonSchema, field_validator

from ..config import Config, DateOrder
from ..errors import (
    CapacityError,
    CerebellarNorseError,
    CheckpointError,
    InputError,
    JobConflictError,
    JobNotFoundError,
    StorageError,
    is_out_of_memory,
)
from ..firsterrors import FirstErrorsModel
from ..storage import atomic_write_bytes, dump_checksummed_json, load_checksummed_json, read_file, what_is_at
from ..ticks import integral_number
from ..timezones import request_zone, request_zone_schema
from .data import DATA_FILE_PATTERN
from .jobprocess import package_at_start, start_job_process
from .stall import StallWatch, process_activity, state_words

JOB_START_RETRY_S = 5.0  # Retry-After of a job whose process could not be started (no process, memory or descriptor)

log = logging.getLogger("cerebellar_norse.training")

JobStateName = Literal["queued", "running", "succeeded", "failed", "cancelled"]
FINAL = ("succeeded", "failed", "cancelled")


# The schema states resolve_data_file's rule for names; resolve_data_file checks it, naming the problem.
DataFileName = Annotated[str, Field(json_schema_extra={"minLength": 1, "pattern": DATA_FILE_PATTERN})]


RequestZone = Annotated[str, WithJsonSchema(request_zone_schema())]


class TrainingRequest(FirstErrorsModel):
    """Parameters of a training job; unset fields take the ``[training]``/``[neural]`` config values."""

    model_config = ConfigDict(extra="forbid", strict=True)

    files: list[DataFileName] = Field(min_length=1, max_length=1000, description="CSV files, relative to paths.data_dir.")
    epochs: int | None = Field(None, ge=1, le=10_000)
    learning_rate: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    sequence_length: int | None = Field(None, ge=1, le=100_000)
    batch_markets: int | None = Field(None, ge=1, le=65_536)
    validation_fraction: float | None = Field(None, gt=0, lt=1, allow_inf_nan=False)
    early_stopping_patience: int | None = Field(None, ge=1, le=1000)
    flat_band: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    max_bad_row_fraction: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    data_timezone: RequestZone | None = Field(None, description="Zone of the files' times without an offset"
                                              " (training.data_timezone): UTC, an IANA name or a fixed offset such as"
                                              " -05:00.")
    date_order: DateOrder | None = Field(
        None, description="Order of day and month in the files' dates with slashes or dots (training.date_order): auto"
        " reads it from each date column and refuses one that cannot tell.")
    adjust_splits: bool | None = Field(None, description="Take a one-day move that matches a stock split ratio out of"
                                       " the prices (training.adjust_splits); false reads every price as written.")
    activate: Literal["auto", "always", "never"] = Field("auto", description="auto: when it beats the active model on validation.")
    from_scratch: bool = Field(False, description="Start from the config's seed, not from the active model's weights "
                               "(as train --from-scratch): the test split is then unseen whatever the active model "
                               "was trained on.")

    @field_validator("epochs", "sequence_length", "batch_markets", "early_stopping_patience", mode="before")
    @classmethod
    def _integral(cls, v: Any) -> Any:
        return integral_number(v)  # 5.0 is an integer in JSON

    @field_validator("data_timezone")
    @classmethod
    def _known_zone(cls, v: str | None) -> str | None:
        return None if v is None else request_zone(v)


def job_config(cfg: Config, req: TrainingRequest) -> Config:
    """The config a job trains with: the service's, overridden by the request."""
    t_over = {k: v for k, v in req.model_dump().items()
              if v is not None and k in type(cfg.training).model_fields}
    n_over = {"learning_rate": req.learning_rate} if req.learning_rate is not None else {}
    return cfg.model_copy(update={"training": cfg.training.model_copy(update=t_over),
                                  "neural": cfg.neural.model_copy(update=n_over)})


@dataclass
class JobStatus:
    """What ``GET /training/status/{job_id}`` reports."""

    job_id: str
    state: JobStateName = "queued"
    files: list[str] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    progress: float = 0.0
    epoch: int = 0
    epochs: int = 0
    loss: float | None = None
    loss_history: list[float] = field(default_factory=list)
    validation: dict[str, Any] | None = None
    validation_history: list[dict[str, Any]] = field(default_factory=list)
    active_model_validation: dict[str, Any] | None = None
    edge: str | None = None
    test: dict[str, Any] | None = None
    ticks_per_second: float | None = None
    eta_s: float | None = None
    model_version: str | None = None
    activated: bool = False
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    report: list[str] = field(default_factory=list)
    last_progress_at: float | None = None  # s since the epoch: the last progress the running job reported (or its start)
    stalled_s: float | None = None  # s without progress or CPU time, once at least training.stall_warning_s (running)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (times as ISO-8601 UTC)."""
        d = asdict(self)
        for k in ("created", "started", "finished", "last_progress_at"):
            v = d[k]
            d[k] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(v)) if v else None
        d["stalled_s"] = None if self.stalled_s is None else round(self.stalled_s, 1)
        d["loss"] = finite_or_none(d["loss"])
        d["loss_history"] = finite_or_none(d["loss_history"])
        return d


# Fields of a job record read back at start (besides job_id, state, files and created), and their types.
_RECORD_FIELDS = ("progress", "epoch", "epochs", "loss", "loss_history", "validation", "model_version", "activated",
                  "warnings", "error", "report", "validation_history", "active_model_validation", "ticks_per_second",
                  "edge", "test")
_JOB_RECORD = TypeAdapter(JobStatus)


def compact_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of an evaluation summary (model and baselines), for job status."""
    keys = ("accuracy", "directional_accuracy", "log_loss", "direction_log_loss", "brier", "ece", "direction_ece", "recall")
    out: dict[str, Any] = {k: summary.get(k) for k in ("samples", "labels", "class_counts", "verdict") if k in summary}
    if "model" in summary:
        out["model"] = {k: summary["model"].get(k) for k in keys}
        out["baselines"] = {name: {k: b.get(k) for k in keys if k != "recall"} for name, b in summary.get("baselines", {}).items()}
    return out


def finite_or_none(x: Any) -> Any:
    """``x`` (a number, or dicts, lists and tuples of them) with every non-finite float as None: JSON has no NaN."""
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    if isinstance(x, numbers.Real) and not isinstance(x, numbers.Integral):  # float, numpy floats
        return float(x) if math.isfinite(x) else None
    return x


# --------------------------------------------------------------------------------------
# The job process
# --------------------------------------------------------------------------------------


def limit_threads(n: int) -> None:
    """Limit this process to ``n`` compute threads (call before heavy imports where possible)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(n)
    import torch

    torch.set_num_threads(n)
    with contextlib.suppress(Exception):
        torch.set_num_interop_threads(1)


def _active_model(store: Any, cfg: Config) -> tuple[Any, str]:
    """The active stored model when it loads and fits ``cfg``; else None and why not."""
    from .checkpoints import shape_mismatch

    version = store.active_version()
    if version is None:
        return None, "no active model"
    try:
        model = store.load(version)
    except CerebellarNorseError as exc:
        return None, f"active model {version} is unreadable: {exc}"
    if shape_mismatch(model.neural, cfg.neural):
        return None, f"active model {version} does not fit this config"
    return model, ""


def run_training(cfg: Config, files: list[Path], epochs: int | None, progress: Any, should_stop: Any,
                 time_budget_s: float | None = None, from_scratch: bool = False, job_id: str | None = None,
                 generated: bool = False) -> dict[str, Any]:
    """Load, train, score on the test split, compare with the active model, save. Returns the job's summary.

    ``generated``: the files hold generated ticks (the first run's), recorded as ``data.generated`` so that no later
    model counts their dates as a period it saw (:func:`~cerebellar_norse.training.checkpoints.trained_on_generated`).

    ``job_id``, for a job of the service, is stored in the model's ``metrics.json``: a restart
    that finds the job's record still ``running`` can then tell whether it stored its model.

    Training starts from the *active* model's weights (``ACTIVE``), or from the
    config's seed when there is none, it does not fit this config, or ``from_scratch``;
    never from another stored model.
    """
    from ..neurons.topology import generate_weights
    from .calibration import base_rates
    from .checkpoints import ModelStore
    from .data import load_training_files
    from .fingerprint import fingerprint, stretch_hashes
    from .scoring import summarise
    from .trainer import evaluate, prepare, train

    store = ModelStore(Path(cfg.paths.state_dir))
    data = load_training_files(files, cfg.training)
    prep = prepare(cfg, data)
    for w in data.notes:  # how the files were read: listed with the warnings, marked as notes
        progress({"warning": w, "note": True})
    for w in prep.warnings:
        progress({"warning": w})
    active, why_not = _active_model(store, cfg)
    if from_scratch:
        initial, start_note = generate_weights(cfg), "from scratch (--from-scratch)"
    elif active is None:
        initial, start_note = generate_weights(cfg), f"from scratch ({why_not})"
    else:
        initial, start_note = active.weights, f"from the active model {active.version}"
    active_val = evaluate(cfg, active.weights, prep) if active is not None else None
    lineage: dict[str, Any] | None = None
    test_seen_until: int | None = None  # the end of what the weights saw, when it lies past the validation period
    if active is not None and not from_scratch:
        # the weights start from the active model's: what it (or a model it started from) was trained and validated
        # on is in sample for this model too, and must not lie in this run's validation or test period
        from .checkpoints import seen_periods, seen_until

        until, ancestor = seen_until(active.metrics, store)
        if until is not None:
            lineage = {"seen_until": until, "from": ancestor or active.version}
            own_until = prep.times.get("validation_until")
            # the test split is partly in sample when a period the weights saw reaches into it: one that ends after
            # this run's validation period and starts before the test split's last tick (a period wholly after the
            # files' ticks, another market's later years, holds none of them)
            last_tick = max((int(m.ticks.timestamp[-1]) for m in prep.markets if len(m.ticks)), default=None)
            reaching = [(last, who or active.version) for first, last, who in seen_periods(active.metrics, store)
                        if own_until is not None and last > own_until
                        and (first is None or last_tick is None or first <= last_tick)]
            if own_until is not None and reaching:
                from .datacheck import iso_ms

                test_seen_until, whose = max(reaching)
                w = (f"training starts from the active model {active.version}, whose weights were fitted on data up to "
                     f"{iso_ms(test_seen_until)} ({whose}'s training and validation period), after this run's validation"
                     f" period (up to {iso_ms(own_until)}): the test split is partly in sample (those ticks were seen); "
                     "train with --from-scratch (a job: \"from_scratch\": true) for an unseen test split")
                prep.warnings.append(w)
                progress({"warning": w})
    result = train(cfg, prep, initial, epochs, progress, should_stop, time_budget_s=time_budget_s)
    if should_stop is not None and should_stop():  # cancelled during the last evaluation: write no model
        raise InterruptedError("training cancelled")
    # the frequencies a model without an edge serves (its priors head): what knowing nothing before the test split is
    base = base_rates(prep.train_counts + prep.val_counts)
    test, _ = summarise(cfg, result.weights, prep, 2, base, bootstrap=300) if prep.test_counts.sum() else ({"samples": 0}, {})
    if test.get("samples"):
        # what the test split supports, as evaluate words it: unseen unless training started from a model that saw it
        from .datacheck import iso_ms
        from .report import verdict

        in_sample = {"since": iso_ms(test_seen_until + 1)} if test_seen_until is not None else None
        test["verdict"] = verdict({**test, "edge": result.edge, "in_sample": in_sample})
    warnings = list(result.warnings)
    if result.edge == "none":
        why = (result.validation.get("cv") or {}).get("reason")
        warnings.append(f"no edge found: {why or 'on validation the network does not beat the base rates'}, so the model "
                        "serves the base rates (auto-activation skips such a model)")
    from .datacheck import check_warning, market_checks

    warnings += [check_warning(m.market_id, c, "the test split, its figures and P&L")
                 for m in data.markets for c in market_checks(m, prep.spec)]
    metrics = {"validation": result.validation, "test": test, "edge": result.edge, "history": result.history,
               "best_epoch": result.best_epoch, "ticks_per_second": result.ticks_per_second,
               "stopped_early": result.stopped_early, "started": start_note, "labels": prep.spec.to_dict(),
               "base_rates": base.tolist(),
               "data": {"files": [str(f) for f in files], "generated": generated, "rows": data.rows, "bad_rows": data.bad_rows,
                        "skipped_rows": data.skipped_rows, "ticks": data.ticks,
                        "markets": len(data.markets), "notes": data.notes, "stock_splits": data.stock_splits,
                        "train_class_counts": prep.train_counts.tolist(),
                        "validation_class_counts": prep.val_counts.tolist(), "test_class_counts": prep.test_counts.tolist(),
                        "splits": prep.times,
                        "fingerprint": fingerprint(stretch_hashes(pm.ticks.price)[pm.split <= 1]
                                                   for pm in prep.markets)},
               "warnings": warnings, "parent_version": active.version if active is not None else None,
               "parent_validation": active_val}
    if lineage is not None:
        metrics["lineage"] = lineage
    if job_id is not None:
        metrics["job_id"] = job_id
    if should_stop is not None and should_stop():  # cancelled, or the service is gone: write no model
        raise InterruptedError("training cancelled")
    version = store.save(result.weights, cfg, metrics)
    return {"model_version": version, "validation": result.validation, "test": test, "edge": result.edge,
            "splits": metrics["data"]["splits"], "stock_splits": data.stock_splits, "lineage": lineage,
            "test_seen_until": test_seen_until,
            "started": start_note, "active_model_validation": active_val,
            "active_version": active.version if active is not None else None, "warnings": warnings}


CANCEL_GRACE_S = 5.0  # how long a cancelled job process has to stop at its next step before it is terminated
KILL_GRACE_S = 2.0  # how long a terminated job process has to end before it is killed (s)
EXIT_WAIT_S = 60.0  # how long the process of an ended job is watched, to be reaped as it exits (its teardown: s)
EXIT_OUT_OF_MEMORY = 75  # the job process's exit code after a MemoryError (or torch's allocation failure)
OUT_OF_MEMORY = ("training ran out of memory (MemoryError, or torch could not allocate; the service's memory limit, "
                 "LimitAS=/MemoryMax= or ulimit -v, holds for its jobs too): train on fewer or smaller files, fewer epochs, "
                 "or raise the limit")


def exit_error(code: int | None) -> str:
    """The error of a job whose process ended without a report (the report itself may not have fitted in memory)."""
    return OUT_OF_MEMORY if code == EXIT_OUT_OF_MEMORY else f"training process exited with code {code}"


JOB_NICENESS = 10  # added to the job process's nice value: serving ticks comes first when the cores are busy


def lower_priority(increment: int = JOB_NICENESS) -> None:
    """Make this process yield the CPU to the service's own threads (``nice``; never an error: at the lowest
    priority already, or where the call is refused, the job runs as it is)."""
    with contextlib.suppress(OSError):
        os.nice(increment)


def _job_main(out: Any, stop: Any, cfg_json: str, files: list[str], epochs: int | None, job_id: str | None = None,
              from_scratch: bool = False) -> None:
    """Entry point of the job process (:func:`~.jobprocess.start_job_process`): ``out`` takes its reports (``put``),
    ``stop`` says when to stop (``is_set``). A service that ends takes the process with it
    (:func:`~.jobprocess.die_with_parent`), so the job need not look for its parent itself."""
    lower_priority()  # (the process ends with the service from its start on: jobprocess.die_with_parent)
    cfg = Config.model_validate_json(cfg_json)
    limit_threads(cfg.training.threads)

    def progress(d: dict[str, Any]) -> None:
        out.put(("progress", d))

    def should_stop() -> bool:
        return bool(stop.is_set())

    out_of_memory = False
    try:
        res = run_training(cfg, [Path(f) for f in files], epochs, progress, should_stop, job_id=job_id,
                           from_scratch=from_scratch)
        out.put(("succeeded", res))
    except MemoryError:
        out_of_memory = True  # said below, once the frames of the failed step (and their arrays) are freed
    except InterruptedError:
        out.put(("cancelled", {}))
    except CerebellarNorseError as exc:
        out.put(("failed", {"error": str(exc), "report": getattr(exc, "report", [])[:200],
                            "input": isinstance(exc, InputError)}))  # the data or the request, not the service
    except Exception as exc:  # reported to the service, which keeps running
        if is_out_of_memory(exc):  # torch's allocator (a RuntimeError): as a MemoryError
            out_of_memory = True
        else:
            out.put(("failed", {"error": f"{type(exc).__name__}: {exc}"}))
    if out_of_memory:
        # Even the report may not fit in memory now (pickling it may fail): the exit code says it too, and the service
        # names the cause from it.
        gc.collect()
        with contextlib.suppress(BaseException):
            out.put(("failed", {"error": OUT_OF_MEMORY}))
            out.close()  # (each put was written when it returned: closing sends nothing more, it ends the pipe)
        os._exit(EXIT_OUT_OF_MEMORY)


# --------------------------------------------------------------------------------------
# The manager in the service
# --------------------------------------------------------------------------------------


def eta_s(first: tuple[float, float], now: float, progress: float) -> float | None:
    """Seconds the epochs still need at their pace since the first step reported (``first``: its
    ``time.monotonic()`` in s and the progress then, 0-1), at ``now`` with ``progress`` done; None before a second
    report. Loading the data before the epochs is not counted (it is no part of their pace), nor scoring after them."""
    t0, p0 = first
    if progress <= p0 or now <= t0:
        return None
    return (now - t0) * (1.0 - progress) / (progress - p0)


async def _ended_within(proc: Any, seconds: float, every_s: float = 0.02) -> bool:
    """Whether process ``proc`` (a :class:`~.jobprocess.JobProcess`) ends within ``seconds`` s (polled on the loop
    every ``every_s`` s)."""
    deadline = time.monotonic() + seconds
    while proc.is_alive():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(every_s)
    return True


class JobManager:
    """Starts, tracks and cancels training jobs of a service (on its event loop)."""

    def __init__(self, cfg: Config | Callable[[], Config], activate: Any, set_loss: Any,
                 on_end: Callable[[str], None] | None = None) -> None:
        """``activate(version) -> None`` swaps a stored model in; ``set_loss(x)`` feeds the training_loss gauge;
        ``on_end(state)`` is called once per job that ends (succeeded, failed, cancelled), and for each job found
        left running by a stopped service when the history is read (failed).

        ``cfg`` is the service's config, or a callable returning its current one: the
        service passes the callable, so keys a reload applies (``training.auto_activate``,
        the ``[training]`` defaults of a job) hold for every job and decision after it.
        """
        self._config: Callable[[], Config] = cfg if callable(cfg) else (lambda: cfg)
        self._activate = activate
        self._set_loss = set_loss
        self._on_end = on_end
        self.jobs: dict[str, JobStatus] = {}
        self.latest: str | None = None
        self._proc: Any = None
        # (job id, epoch) and the sum and count of its steps' losses: the running job's epoch so far
        self._epoch_losses: tuple[tuple[str, int] | None, tuple[float, int]] = (None, (0.0, 0))
        self._stop: Any = None
        self._task: asyncio.Task[None] | None = None
        self._watch: StallWatch | None = None  # whether the running job still makes progress
        self._active_at_start: str | None = None  # what models/ACTIVE named when the running job started
        self._cancelling: dict[str, str | None] = {}  # job id -> why, while a cancel is under way (None: a client's)
        self._unwritten: set[str] = set()  # jobs whose newest record could not be written (a full disk): in memory
        self._retired: list[Any] = []  # processes of ended jobs not yet seen to end (reaped at the next start, close)
        self._lingering: set[int] = set()  # pids of those SIGKILLed that did not end (an uninterruptible wait)
        self.jobs_dir = Path(self.cfg.paths.state_dir) / "jobs"
        self._package = package_at_start()  # the code on disk the service started with (its jobs run the code on disk)
        self._load_history()

    @property
    def cfg(self) -> Config:
        """The service's current config."""
        return self._config()

    def _load_history(self) -> None:
        if not self.jobs_dir.is_dir():
            if self.jobs_dir.exists() or self.jobs_dir.is_symlink():  # a file (or a link to nothing) where it goes
                self._misplaced_jobs_dir_aside()
            return
        for p in self.jobs_dir.glob(".*.json.*.tmp"):  # a record whose writing a crash cut off: the previous is whole
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cannot remove %s, left by a job record's write a crash cut off: %s", p, exc)
        order: dict[str, tuple[float, float]] = {}  # job id -> (created, record's mtime): the latest job is the newest
        for p in sorted(self.jobs_dir.glob("*.json")):
            try:
                d, _ = load_checksummed_json(read_file(p), str(p))
                kept = {k: d[k] for k in _RECORD_FIELDS if k in d}
                st = _JOB_RECORD.validate_python({"job_id": d["job_id"], "state": d["state"], "files": d.get("files", []),
                                                  **kept})  # each field of its type: a record is read back as written
                for k in ("created", "started", "finished", "last_progress_at"):  # as_dict wrote them as ISO-8601 UTC
                    if d.get(k):
                        setattr(st, k, calendar.timegm(time.strptime(d[k], "%Y-%m-%dT%H:%M:%SZ")))
                if st.state in ("queued", "running"):  # its service died with it: the job process died too
                    st.state = "failed"
                    stored = self._model_of_job(st.job_id)
                    if stored is None:
                        st.error = ("the service stopped while the job was running; the job process ended with it and "
                                    "wrote no model")
                    elif self._is_active(stored):  # it died while (or after) activating it: the model is served
                        st.model_version = stored
                        st.activated = True
                        st.error = (f"the service stopped before the end of the job was recorded; the job had stored its "
                                    f"model {stored}, which is active (models/ACTIVE names it)")
                    else:  # the job stored its model just before the service died: say so, never "no model"
                        st.model_version = stored
                        st.error = (f"the service stopped before the end of the job was recorded; the job had stored its "
                                    f"model {stored}, which was not activated (activate it with POST /models/{stored}"
                                    f"/activate)")
                    # logged as a job that fails while the service runs is (ERROR): the alert
                    # CerebellarNorseTrainingJobFailed points at `journalctl … | grep 'training job failed'`
                    self._ended(st, logging.ERROR)
                self.jobs[st.job_id] = st
                order[st.job_id] = (st.created if d.get("created") else 0.0, p.stat().st_mtime)
            except (OSError, CheckpointError, ValueError, KeyError, TypeError) as exc:  # a damaged record costs its history only
                log.warning("ignoring unreadable job record %s (%s: %s)", p, type(exc).__name__, exc)
        # job ids are random: the file names' order says nothing of which job ran last
        self.jobs = dict(sorted(self.jobs.items(), key=lambda kv: order[kv[0]]))
        self.latest = next(reversed(self.jobs), None)
        self._prune_records()

    def _prune_records(self) -> None:
        """Forget the oldest finished jobs beyond ``training.keep_job_records``: their records deleted, then dropped
        from memory (a job every few minutes made ``jobs/`` and the service's memory grow for good, and every start
        read them all). The running job and the latest are never dropped. A record that cannot be deleted is kept,
        in memory too, and tried again when the next job ends (one WARNING per try)."""
        excess = len(self.jobs) - self.cfg.training.keep_job_records
        if excess <= 0:
            return
        oldest = [jid for jid, job in self.jobs.items() if job.state in FINAL and jid != self.latest][:excess]
        for job_id in oldest:
            path = self.jobs_dir / f"{job_id}.json"
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("cannot delete the record %s of an old training job (training.keep_job_records = %d): "
                            "%s; it is kept and tried again when the next job ends", path,
                            self.cfg.training.keep_job_records, StorageError.os_reason(exc),
                            extra={"fields": {"job_id": job_id, "path": str(path), "errno": exc.errno}})
                return
            del self.jobs[job_id]
            self._unwritten.discard(job_id)

    def _misplaced_jobs_dir_aside(self) -> None:
        """Move aside (``jobs.misplaced-<UTC time>``, WARNING) what stands where the job records' directory goes and is
        none: every job's record failed to be written (`File exists`), said as waiting for room that never came. It
        holds no record of this service's, so nothing is lost; a move that fails is said, and the records are kept in
        memory as for a full disk."""
        from ..engine.persistence import quarantine

        what = what_is_at(self.jobs_dir)
        try:
            moved = quarantine(self.jobs_dir, "misplaced")
        except CerebellarNorseError as exc:
            log.warning("%s is %s, and moving it aside failed (%s): job records cannot be written until it is removed",
                        self.jobs_dir, what, exc)
            return
        log.warning("%s is %s, not the directory of the job records: moved aside to %s", self.jobs_dir, what, moved)

    def _model_of_job(self, job_id: str) -> str | None:
        """The version of the stored model a job wrote (its ``metrics.json`` names the job), else None."""
        from .checkpoints import ModelStore

        store = ModelStore(Path(self.cfg.paths.state_dir))
        with contextlib.suppress(OSError):
            for version in store.versions():
                if (store.metrics_of(version) or {}).get("job_id") == job_id:
                    return version
        return None

    def _is_active(self, version: str) -> bool:
        """Whether ``models/ACTIVE`` names ``version`` (False when it cannot be read)."""
        return self._active_named() == version

    def _active_named(self) -> str | None:
        """The version ``models/ACTIVE`` names (None when there is none or it cannot be read)."""
        from .checkpoints import ACTIVE, ModelStore, read_active

        version_named, _ = read_active(ModelStore(Path(self.cfg.paths.state_dir)).root / ACTIVE)
        return version_named

    @property
    def busy(self) -> bool:
        """A job is queued or running."""
        return any(j.state in ("queued", "running") for j in self.jobs.values())

    def start(self, req: TrainingRequest) -> JobStatus:
        """Validate the request and start its job; JobConflictError when one is running."""
        from .data import resolve_data_file

        cfg = job_config(self.cfg, req)
        paths = [resolve_data_file(Path(cfg.paths.data_dir), f) for f in req.files]
        first: dict[Path, str] = {}  # each file once: a second reading of its ticks goes back in time (all bad rows)
        for name, path in zip(req.files, paths, strict=True):
            if path in first:
                same = "is named twice" if first[path] == name else f"is the same file as {first[path]!r}"
                raise InputError(f"{name!r} {same} ({path}): name each file once", "files")
            first[path] = name
        if self.busy:
            running = next(j.job_id for j in self.jobs.values() if j.state in ("queued", "running"))
            raise JobConflictError(f"job {running} is still running; one job at a time (cancel it with DELETE /training/{running})")
        job = JobStatus(job_id=uuid.uuid4().hex[:12], files=list(req.files), epochs=cfg.training.epochs)
        latest = self.latest
        self.jobs[job.job_id] = job
        self.latest = job.job_id
        self._active_at_start = self._active_named()  # the model the job compares itself with
        self._reap()
        try:
            self._proc, out, self._stop = start_job_process(
                f"{__name__}:_job_main", (cfg.model_dump_json(), [str(p) for p in paths], req.epochs, job.job_id,
                                          req.from_scratch), self._package)
        except (OSError, RuntimeError) as exc:  # no process (EAGAIN: the task limit), memory or descriptor for it
            del self.jobs[job.job_id]  # never started: no record of it, and the next request may start one
            self.latest, self._proc = latest, None
            reason = StorageError.os_reason(exc) if isinstance(exc, OSError) else str(exc)
            log.warning("training job not started: cannot start its process: %s", reason,
                        extra={"fields": {"errno": getattr(exc, "errno", None)}})
            raise CapacityError(f"cannot start the training job's process: {reason}; nothing was started (the host is "
                                f"short of processes, memory or file descriptors for now): try again",
                                retry_after_s=JOB_START_RETRY_S) from None
        job.state = "running"
        job.started = job.last_progress_at = time.time()
        self._watch = StallWatch(job.job_id, time.monotonic())
        self._write_record(job)
        self._task = asyncio.get_running_loop().create_task(self._monitor(job, out, req.activate))
        log.info("training job started", extra={"fields": {"job_id": job.job_id, "files": req.files}})
        return job

    def get(self, job_id: str) -> JobStatus:
        """A job by id (``latest`` for the most recent)."""
        jid = self.latest if job_id == "latest" else job_id
        if jid is None and job_id == "latest":
            raise JobNotFoundError("no training job has run yet (start one with POST /training)", "job_id")
        if jid is None or jid not in self.jobs:
            raise JobNotFoundError(f"no training job {job_id!r}", "job_id")
        return self.jobs[jid]

    async def cancel(self, job_id: str, why: str | None = None) -> JobStatus:
        """Cancel a queued or running job (the process is stopped; no model is written, unless the job had stored it
        before the cancel reached it: then ``model_version`` and ``error`` name it, not activated). ``why`` goes to
        the job's ``error``: the reason of a cancel that no client asked for."""
        job = self.get(job_id)
        if job.state in FINAL:
            return job
        first = job.job_id not in self._cancelling  # (a DELETE during the shutdown's cancel keeps its reason)
        if first:
            self._cancelling[job.job_id] = why  # _monitor, which often sees the end first, records it as this cancel's
        try:
            if self._stop is not None:
                self._stop.set()
            proc = self._proc
            # The process checks the stop flag between training steps; before its first step (its imports, reading
            # the files: seconds, writing nothing) it never would, and the cancel waited the whole grace for nothing.
            deadline = time.monotonic() + (CANCEL_GRACE_S if job.epoch > 0 else 0.0)
            while proc is not None and proc.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc is not None and proc.is_alive() and not await self._end_process(proc):
                self._lingering.add(proc.pid)  # SIGKILLed and said so: a stop does not do it all again
            stored = None if job.state in FINAL else self._model_of_job(job.job_id)
            if stored is not None:  # its "succeeded" was still on its way to _monitor: never answer "no model" then
                job.model_version = stored
            self._finish(job, "cancelled", self._cancel_error(job.job_id, stored))
        finally:
            if first:
                self._cancelling.pop(job.job_id, None)
        return job

    @staticmethod
    async def _end_process(proc: Any) -> bool:
        """End a job process that did not stop by itself: SIGTERM, then SIGKILL after :data:`KILL_GRACE_S` s.

        A stopped process (``kill -STOP``, a cgroup freezer, a debugger holding it) keeps a SIGTERM pending without
        ending: the cancel answered "cancelled, no model written" while the process lived on (and could write its
        model once continued), and at shutdown the interpreter's wait for its child hung the stop until systemd's
        ``TimeoutStopSec`` killed the service. SIGKILL ends it stopped or not.

        Returns whether it ended (False: it lingers in an uninterruptible wait, said in one WARNING).
        """
        proc.terminate()
        if await _ended_within(proc, KILL_GRACE_S):
            return True
        log.warning("training job process %s did not end %g s after SIGTERM (stopped?): killed (SIGKILL)", proc.pid,
                    KILL_GRACE_S, extra={"fields": {"pid": proc.pid}})
        proc.kill()
        if await _ended_within(proc, KILL_GRACE_S):
            return True
        seen = process_activity(proc.pid)  # in an uninterruptible wait (D state: a dead mount, a frozen cgroup v1)
        state = state_words(seen)
        log.warning("training job process %s did not end %g s after SIGKILL either (it is %s): it ends when its wait "
                    "does (restore the mount, thaw its cgroup); the job is recorded cancelled, it can write no model, "
                    "and the next job may start", proc.pid, KILL_GRACE_S, state,
                    extra={"fields": {"pid": proc.pid, "process_state": seen[1] if seen is not None else None}})
        return False

    def _cancel_error(self, job_id: str, stored: str | None = None) -> str | None:
        """The ``error`` of a job cancelled by the cancel under way: its reason (None for a client's), and the model
        it had stored, if any."""
        why = self._cancelling.get(job_id)
        if stored is not None:
            return (f"{why or 'cancelled'}; the job had stored its model {stored} before the cancel reached it, which "
                    f"was not activated (activate it with POST /models/{stored}/activate)")
        return None if why is None else f"{why}; the job wrote no model"

    async def close(self) -> None:
        """Stop a running job at shutdown (and try once more the records that could not be written)."""
        for job in list(self.jobs.values()):  # (a request may add one while a cancel waits)
            if job.state in ("queued", "running"):
                await self.cancel(job.job_id, "cancelled because the service stopped while the job was running")
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=CANCEL_GRACE_S)  # (its end closes the job's pipes)
        await self._wait_retired()
        self.write_pending()

    async def _monitor(self, job: JobStatus, out: Any, activate: str) -> None:
        """Read the job's reports until it ends; then close the service's ends of its pipes (``out``, the stop
        pipe) and keep its process to be reaped (:meth:`_reap`), so that nothing of a job outlives it."""
        proc, stop = self._proc, self._stop
        try:
            await self._read_reports(job, out, activate)
        finally:
            for end in (out, stop):
                close = getattr(end, "close", None)  # (the pipes' ends; a stand-in without close has nothing open)
                if close is not None:
                    close()
            if stop is self._stop:
                self._stop = None
            if proc is not None:
                self._retired.append(proc)
                await _ended_within(proc, EXIT_WAIT_S, every_s=0.1)  # reaped as it ends: no zombie between jobs
            self._reap()

    def _reap(self) -> None:
        """Forget the processes of ended jobs that have ended (``is_alive`` reaps them: no zombie is left)."""
        self._retired = [p for p in self._retired if p.is_alive()]
        self._lingering &= {p.pid for p in self._retired}

    async def _wait_retired(self) -> None:
        """At shutdown: let the processes of ended jobs end (a finished job's exits within moments), else end them
        (:meth:`_end_process`), so that none outlives the service (systemd would kill it at the stop); one already
        SIGKILLed by its cancel (in an uninterruptible wait) is not ended, nor said to linger, a second time."""
        for proc in list(self._retired):
            if not await _ended_within(proc, KILL_GRACE_S) and proc.pid not in self._lingering:
                await self._end_process(proc)
        self._reap()

    async def _read_reports(self, job: JobStatus, out: Any, activate: str) -> None:
        loop = asyncio.get_running_loop()
        first: tuple[float, float] | None = None  # (time.monotonic(), progress) of the first step reported
        while job.state not in FINAL:
            try:
                kind, data = await loop.run_in_executor(None, out.get, True, 0.2)
            except queue.Empty:
                self._check_stall(job)
                if (self._proc is not None and not self._proc.is_alive() and job.state not in FINAL
                        and job.job_id not in self._cancelling):  # (a cancel terminates it: that cancel records it)
                    self._finish(job, "failed", exit_error(self._proc.exitcode))
                continue
            except (EOFError, OSError):
                # The job process ended and nothing more can come (killed, maybe in the middle of its result: a read
                # of the rest waited forever, the job "running" for good and the service's stop hung on that read).
                proc = self._proc
                if proc is not None:
                    await _ended_within(proc, KILL_GRACE_S)
                if job.state not in FINAL and job.job_id not in self._cancelling:
                    self._finish(job, "failed", exit_error(proc.exitcode if proc is not None else None))
                return
            self._reported(job)
            if kind == "progress":
                self._on_progress(job, data)
                if "warning" not in data:
                    now = time.monotonic()
                    first = first or (now, job.progress)
                    job.eta_s = eta_s(first, now, job.progress)
            elif kind == "succeeded":
                self._on_success(job, data, activate)
            elif kind == "cancelled":
                self._finish(job, "cancelled", self._cancel_error(job.job_id))
            else:
                job.report = list(data.get("report", []))
                self._finish(job, "failed", data.get("error", "unknown error"), bool(data.get("input")))

    def _reported(self, job: JobStatus) -> None:
        """The job's process sent something (progress, a warning, its result): it is not stalled."""
        job.last_progress_at = time.time()
        job.stalled_s = None
        if self._watch is not None:
            self._watch.reported(time.monotonic())

    def _check_stall(self, job: JobStatus) -> None:
        """Whether the running job is stalled (:mod:`.stall`): sets its ``stalled_s`` (None when not)."""
        if self._watch is None or job.state != "running":
            return
        proc = self._proc
        job.stalled_s = self._watch.check(proc.pid if proc is not None else None, time.monotonic(),
                                          self.cfg.training.stall_warning_s)

    @property
    def stalled(self) -> bool:
        """Whether a running job is stalled (the ``cerebellar_norse_training_job_stalled`` gauge)."""
        return any(j.state == "running" and j.stalled_s is not None for j in self.jobs.values())

    def _on_progress(self, job: JobStatus, d: dict[str, Any]) -> None:
        if "warning" in d:
            job.warnings.append(d["warning"])
            return
        job.epoch, job.epochs = d["epoch"], d["epochs"]
        done = (d["epoch"] - 1 + d["step"] / max(d["steps"], 1)) / max(d["epochs"], 1)
        job.progress = min(max(done, 0.0), 1.0)
        job.ticks_per_second = d.get("ticks_per_second")
        loss = d.get("loss")
        if isinstance(loss, float) and math.isfinite(loss):
            if not d.get("epoch_done"):  # a step's mini-batch loss: the epoch's mean so far (its mean at its end)
                key = (job.job_id, job.epoch)
                total, n = self._epoch_losses[1] if self._epoch_losses[0] == key else (0.0, 0)
                self._epoch_losses = (key, (total + loss, n + 1))
                loss = (total + loss) / (n + 1)
            job.loss = loss
            self._set_loss(loss)
        if d.get("epoch_done"):
            job.loss_history.append(d["loss"])
            job.validation = d.get("validation")
            if job.validation is not None:
                job.validation_history.append(job.validation)

    def _on_success(self, job: JobStatus, res: dict[str, Any], activate: str) -> None:
        job.model_version = res["model_version"]
        job.validation = res["validation"]
        job.active_model_validation = res.get("active_model_validation")
        job.edge = res.get("edge")
        job.test = compact_summary(res.get("test") or {})
        job.progress = 1.0
        job.eta_s = 0.0
        new_loss = (res["validation"] or {}).get("loss")
        old = res.get("active_model_validation")
        old_loss = old.get("loss") if old else None
        better = old_loss is None or (new_loss is not None and new_loss < old_loss)
        edge = res.get("edge") == "direction"
        want = activate == "always" or (activate == "auto" and self.cfg.training.auto_activate and better and edge)
        now = self._active_named() if want and activate == "auto" else self._active_at_start
        if now != self._active_at_start:  # an operator activated another model meanwhile: the job beat one not served
            job.warnings.append(f"model kept inactive: the active model changed while the job ran (from "
                                f"{self._active_at_start or 'none'} to {now or 'none'}), the one it was compared with "
                                f"is no longer served (activate it with POST /models/{job.model_version}/activate)")
        elif want:
            try:
                self._activate(job.model_version)
                job.activated = True
            except CerebellarNorseError as exc:
                job.warnings.append(f"model not activated: {exc}")
        elif activate == "auto" and not self.cfg.training.auto_activate:
            job.warnings.append("model kept inactive: training.auto_activate is false (activate it with POST /models/"
                                f"{job.model_version}/activate, or ask for activate=always)")
        elif activate == "auto" and not edge:
            job.warnings.append(f"model kept inactive: no directional edge found on validation (edge: {res.get('edge')})")
        elif activate == "auto":
            job.warnings.append(f"model kept inactive: validation loss {new_loss} does not beat the active model's {old_loss}")
        self._finish(job, "succeeded", None)

    def _finish(self, job: JobStatus, state: JobStateName, error: str | None, input_error: bool = False) -> None:
        """Record the job's end; logged at INFO, a failure at ERROR, or at WARNING when its data or request caused it
        (``input_error``: a bad file, too few ticks; the service is fine and the answer is in the job's status)."""
        if job.state in FINAL:
            return
        job.state = state
        job.error = error
        job.finished = time.time()
        job.stalled_s = None
        self._proc = None
        self._ended(job, logging.INFO if state != "failed" else logging.WARNING if input_error else logging.ERROR)
        self._prune_records()

    def _ended(self, job: JobStatus, level: int) -> None:
        """Log a job's end (``training job <state>`` at ``level``), write its record and tell ``on_end``."""
        log.log(level, "training job %s", job.state,
                extra={"fields": {"job_id": job.job_id, "error": job.error, "model_version": job.model_version,
                                  "activated": job.activated}})
        self._write_record(job)
        if self._on_end is not None:
            self._on_end(job.state)

    def _write_record(self, job: JobStatus) -> None:
        """Write ``jobs/<job_id>.json`` atomically, and then any record that could not be written before.

        A record that cannot be written (a full disk) stays in memory, where ``GET /training/status/<job_id>``
        answers it, and is written with the next record that can be, after the next checkpoint
        (:meth:`write_pending`) or at shutdown; until then a restart forgets it. The failure is logged once at ERROR
        (path, errno) however many records fail after it, and one INFO line says when they are written.
        """
        if self._write_one(job):
            self.write_pending()

    def _write_one(self, job: JobStatus) -> bool:
        """Write one job's record as it is now; False (kept in memory, logged once) when it cannot be written."""
        path = self.jobs_dir / f"{job.job_id}.json"
        try:
            atomic_write_bytes(path, dump_checksummed_json(job.as_dict()))
        except OSError as exc:
            if not self._unwritten:  # the first of a run of failures: said once
                err = StorageError.from_os_error("cannot write job record", path, exc)
                log.error("%s; the job's record is kept in memory (GET /training/status/%s answers it) and written "
                          "once the state dir can take it (with the next job record, after the next checkpoint or at "
                          "shutdown): a restart before then forgets it", err, job.job_id,
                          extra={"fields": {"job_id": job.job_id, "path": str(path), "errno": exc.errno}})
            self._unwritten.add(job.job_id)
            return False
        if job.job_id in self._unwritten:
            self._unwritten.discard(job.job_id)
            if not self._unwritten:
                log.info("job records written again", extra={"fields": {"job_id": job.job_id, "path": str(path)}})
        return True

    def write_pending(self) -> None:
        """Write the records that could not be written before (a full disk since freed); the first that still
        cannot be written stops the try, silently (its failure was logged)."""
        for job_id in sorted(self._unwritten):
            job = self.jobs.get(job_id)
            if job is None:
                self._unwritten.discard(job_id)
            elif not self._write_one(job):
                return
