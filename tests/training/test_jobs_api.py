"""Training jobs and model activation against the real server over a socket.

One server for the module (``cerebellar-norse --port P`` in a subprocess) with a bearer
token, a data dir holding a small generated CSV, and a state dir prepared with three
stored models of the default network: A (active), B (another valid one) and C (corrupt).
The tests run in order: refusals, a cancelled job, a job that succeeds and is activated,
a refused activation of C, then a hot swap to B under load.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from training_helpers import TINY_NEURAL, ConfigFactory, CsvFactory, LiveServer, start

from cerebellar_norse.config import load_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training.checkpoints import ModelStore
from cerebellar_norse.training.data import write_csv
from cerebellar_norse.training.jobs import JOB_NICENESS, JobStatus, TrainingRequest, job_config, run_training

TOKEN = "secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
VA, VB, VC = "20240101T000000Z-aaaaaa", "20240102T000000Z-bbbbbb", "20240103T000000Z-cccccc"
JOB_TIMEOUT_S = 180.0
T0 = 1_640_995_200_000


@dataclass
class JobServer:
    srv: LiveServer
    client: httpx.Client
    store: ModelStore


@pytest.fixture(scope="module")
def js(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobServer]:
    root = tmp_path_factory.mktemp("jobs")
    state, data = root / "state", root / "data"
    write_csv(data / "small.csv", generate_ticks(6000, 2, seed=1))
    cfg = load_config(None, environ={})
    store = ModelStore(state)
    w = generate_weights(cfg)
    metrics = {"validation": {"loss": 1.1}}
    store.save(w, cfg, metrics, version=VA)
    wb = w.copy()
    wb.pf_w = (wb.pf_w * 1.5).astype(wb.pf_w.dtype)
    wb.w_out = (wb.w_out[::-1]).copy()  # another readout: visibly different answers
    store.save(wb, cfg, metrics, version=VB)
    store.save(wb, cfg, metrics, version=VC)
    npz = store.root / VC / "weights.npz"
    raw = bytearray(npz.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    npz.write_bytes(bytes(raw))
    store.set_active(VA)
    srv = start(state, root / "server.log", {"CEREBELLAR_NORSE_PATHS__DATA_DIR": str(data),
                                             "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN})
    try:
        with httpx.Client(base_url=srv.url, timeout=30.0) as client:
            yield JobServer(srv, client, store)
    finally:
        rc = srv.stop()
    assert rc == 0, f"server exited with {rc} after SIGTERM\n{srv.log()[-4000:]}"


def served_version(c: httpx.Client) -> str:
    r = c.get("/health")
    assert r.status_code == 200, r.text
    v: str = r.json()["model_version"]
    return v


def jobs_ended(c: httpx.Client) -> dict[str, float]:
    """``cerebellar_norse_training_jobs_total`` of /metrics by state (every state exported from the start, at 0)."""
    found = re.findall(r'^cerebellar_norse_training_jobs_total\{state="(\w+)"\} (\S+)$', c.get("/metrics").text, re.M)
    ended = {state: float(v) for state, v in found}
    assert set(ended) == {"succeeded", "failed", "cancelled"}, ended
    return ended


def wait_final(js: JobServer, job_id: str, by_latest: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Poll the job's status until it is final; returns the last status and the states seen."""
    seen: list[str] = []
    deadline = time.monotonic() + JOB_TIMEOUT_S
    k = 0
    while time.monotonic() < deadline:
        ref = "latest" if by_latest and k % 2 else job_id
        r = js.client.get(f"/training/status/{ref}", headers=AUTH)
        assert r.status_code == 200, r.text
        st = r.json()
        assert st["job_id"] == job_id
        if not seen or seen[-1] != st["state"]:
            seen.append(st["state"])
        if st["state"] in ("succeeded", "failed", "cancelled"):
            return st, seen
        k += 1
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not finished within {JOB_TIMEOUT_S}s\n{js.srv.log()[-4000:]}")


def job_processes(parent: int) -> list[int]:
    """The pids of ``parent``'s job processes (:func:`cerebellar_norse.training.jobprocess.start_job_process`)."""
    pids = []
    for children in Path(f"/proc/{parent}/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"cerebellar_norse.training.jobprocess" in cmdline:
                pids.append(int(pid))
    return pids


def model_dirs(store: ModelStore) -> list[str]:
    return sorted(p.name for p in store.root.iterdir() if p.is_dir())


# --------------------------------------------------------------------------------------
# In process: the request, the job's config, run_training and cancellation
# --------------------------------------------------------------------------------------


def test_request_overrides_the_config(make_config: ConfigFactory) -> None:
    cfg = make_config()
    req = TrainingRequest.model_validate({"files": ["a.csv"], "epochs": 2, "learning_rate": 0.01, "flat_band": 0.001,
                                          "early_stopping_patience": 4})
    jc = job_config(cfg, req)
    assert jc.training.epochs == 2 and jc.training.flat_band == 0.001 and jc.training.early_stopping_patience == 4
    assert jc.neural.learning_rate == 0.01
    assert jc.training.sequence_length == cfg.training.sequence_length and jc.neural.seed == cfg.neural.seed
    assert job_config(cfg, TrainingRequest.model_validate({"files": ["a.csv"]})) == cfg


@pytest.mark.parametrize(("names", "said"), [(["t.csv", "t.csv"], "'t.csv' is named twice"),
                                              (["t.csv", "./t.csv"], "'./t.csv' is the same file as 't.csv'"),
                                              (["t.csv", "link.csv"], "'link.csv' is the same file as 't.csv'")])
def test_a_file_named_twice_is_refused_before_any_job_starts(make_config: ConfigFactory, ticks_csv: CsvFactory,
                                                              names: list[str], said: str) -> None:
    """Its ticks would be read twice, the second time going back in time (every row bad): 422 naming files, and no
    job is started or recorded."""
    from cerebellar_norse.errors import InputError
    from cerebellar_norse.training.jobs import JobManager

    cfg = make_config()
    path = ticks_csv(50, 1, name="t.csv")
    (path.parent / "link.csv").symlink_to(path.name)
    mgr = JobManager(cfg, lambda version: None, lambda loss: None)

    async def refused() -> InputError:
        try:
            with pytest.raises(InputError) as caught:
                mgr.start(TrainingRequest.model_validate({"files": names}))
        finally:
            await mgr.close()
        return caught.value

    err = asyncio.run(refused())
    assert err.status_code == 422 and err.field == "files" and said in err.message, err
    assert mgr.jobs == {} and mgr.latest is None and not (Path(cfg.paths.state_dir) / "jobs").exists()


def test_status_reports_nan_as_null() -> None:
    st = JobStatus(job_id="x", loss=math.nan, loss_history=[1.0, math.nan])
    d = st.as_dict()
    assert d["loss"] is None and d["loss_history"] == [1.0, None] and d["created"].endswith("Z")


def test_run_training_stores_a_model_and_a_late_cancel_writes_none(make_config: ConfigFactory, ticks_csv: CsvFactory) -> None:
    cfg = make_config(neural=TINY_NEURAL)
    path = ticks_csv(800, 2, seed=2)
    store = ModelStore(cfg.paths.state_dir)
    stop = [False]

    def progress(d: dict[str, Any]) -> None:
        if d.get("epoch_done"):
            stop[0] = True  # DELETE arrives while the last epoch is being evaluated

    with pytest.raises(InterruptedError):
        run_training(cfg, [path], 1, progress, lambda: stop[0])
    assert store.versions() == [] and store.clean_partial() == []

    warnings: list[str] = []
    res = run_training(cfg, [path], 1, lambda d: warnings.append(d["warning"]) if "warning" in d else None, lambda: False)
    assert store.versions() == [res["model_version"]]
    assert res["active_version"] is None and res["active_model_validation"] is None
    assert len(warnings) == 3 and res["warnings"][:3] == warnings  # under 10,000 samples per class
    assert res["edge"] in ("none", "flat", "direction") and res["started"] == "from scratch (no active model)"
    if res["edge"] == "none":  # 800 ticks of a tiny network: usually no edge, and then it says so
        assert res["warnings"][3].startswith("no edge found")
    stored = store.load(res["model_version"])
    assert stored.metrics["data"]["skipped_rows"] == 0
    assert stored.metrics["data"]["rows"] == 800 and stored.metrics["validation"]["loss"] == pytest.approx(res["validation"]["loss"])
    # a stored but inactive model is never the starting point
    res1 = run_training(cfg, [path], 1, lambda d: None, lambda: False)
    assert res1["active_version"] is None and res1["started"] == "from scratch (no active model)"
    # the next job starts from the active model and compares with it on the same split
    store.set_active(res["model_version"])
    res2 = run_training(cfg, [path], 1, lambda d: None, lambda: False)
    assert res2["active_version"] == res["model_version"] and res2["started"] == f"from the active model {res['model_version']}"
    assert res2["active_model_validation"]["loss"] == pytest.approx(res["validation"]["loss"])
    res3 = run_training(cfg, [path], 1, lambda d: None, lambda: False, from_scratch=True)
    assert res3["started"] == "from scratch (--from-scratch)"


# --------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------


def test_token_is_required(js: JobServer) -> None:
    c = js.client
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = c.post("/training", json={"files": ["small.csv"]}, headers=headers)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["type"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
    for path in ("/training/status/latest", "/models"):
        assert c.get(path).status_code == 401
    assert c.post(f"/models/{VB}/activate").status_code == 401
    assert c.delete("/training/whatever").status_code == 401
    assert served_version(c) == VA


@pytest.mark.parametrize(("body", "field"), [
    ({"files": ["/etc/passwd"]}, "files"),
    ({"files": [str(Path("/tmp") / "small.csv")]}, "files"),
    ({"files": ["../state/models/ACTIVE"]}, "files"),
    ({"files": ["sub/../../small.csv"]}, "files"),
    ({"files": []}, "files"),
    ({"files": "small.csv"}, "files"),
    ({"files": ["small.csv"], "gpus": 8}, "gpus"),
    ({"files": ["small.csv"], "epochs": 0}, "epochs"),
    ({"files": ["small.csv"], "learning_rate": "fast"}, "learning_rate"),
    ({"files": ["small.csv"], "activate": "sometimes"}, "activate"),
    ({"files": ["small.csv", "small.csv"]}, "files"),
    ({"files": ["small.csv", "./small.csv"]}, "files"),
    ({}, "files"),
])
def test_invalid_requests_are_422_naming_the_field(js: JobServer, body: dict[str, Any], field: str) -> None:
    r = js.client.post("/training", json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["field"] == field, err
    assert err["type"] == "validation"


def test_file_name_with_a_lone_surrogate_is_422_not_500(js: JobServer) -> None:
    """JSON can escape an unpaired surrogate ("\\ud800"), which no file name can hold: 422 naming files."""
    for raw in ('{"files": ["\\ud800.csv"]}', '{"files": ["small.csv", "ok\\udfff"]}'):
        r = js.client.post("/training", content=raw, headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert (err["type"], err["field"]) == ("validation", "files"), err


def test_missing_data_file_is_404(js: JobServer) -> None:
    r = js.client.post("/training", json={"files": ["missing.csv"]}, headers=AUTH)
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert (err["type"], err["field"]) == ("not_found", "files")
    assert "missing.csv" in err["message"]


def test_unknown_job_is_404(js: JobServer) -> None:
    r = js.client.get("/training/status/nope", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["field"] == "job_id"
    r = js.client.get("/training/status/latest", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["message"].startswith("no training job has run yet")  # no job yet
    assert js.client.delete("/training/nope", headers=AUTH).status_code == 404


# --------------------------------------------------------------------------------------
# A cancelled job
# --------------------------------------------------------------------------------------


def test_second_job_conflicts_and_cancel_leaves_no_model(js: JobServer) -> None:
    c = js.client
    before = model_dirs(js.store)
    r = c.post("/training", json={"files": ["small.csv"], "epochs": 1000}, headers=AUTH)
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    assert r.json()["state"] == "running"
    doc = c.get("/openapi.json").json()  # the 202 answer is documented as it is: job_id, state, status_url
    ref = doc["paths"]["/training"]["post"]["responses"]["202"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert set(schema["required"]) == set(r.json()) == {"job_id", "state", "status_url"}, schema

    r2 = c.post("/training", json={"files": ["small.csv"], "epochs": 1}, headers=AUTH)
    assert r2.status_code == 409, r2.text
    assert job_id in r2.json()["error"]["message"] and r2.json()["error"]["type"] == "conflict"
    assert r2.json()["error"]["field"] is None  # about the service's state, not a field: it named "job", no field

    deadline = time.monotonic() + JOB_TIMEOUT_S
    while True:  # wait until the job process is inside its training loop
        st = c.get(f"/training/status/{job_id}", headers=AUTH).json()
        assert st["state"] == "running", st
        if st["progress"] > 0:
            break
        assert time.monotonic() < deadline, js.srv.log()[-4000:]
        time.sleep(0.1)
    assert st["epochs"] == 1000 and st["epoch"] == 1 and st["ticks_per_second"] > 0
    # the job yields the CPU to the service's event loop: its process runs JOB_NICENESS lower
    served = os.getpriority(os.PRIO_PROCESS, js.srv.proc.pid)
    lowered = min(19, served + JOB_NICENESS)  # 19: the lowest priority
    assert lowered in {os.getpriority(os.PRIO_PROCESS, pid) for pid in job_processes(js.srv.proc.pid)}

    r3 = c.delete(f"/training/{job_id}", headers=AUTH)
    assert r3.status_code == 200, r3.text
    assert r3.json()["state"] == "cancelled" and r3.json()["model_version"] is None
    st = c.get(f"/training/status/{job_id}", headers=AUTH).json()
    assert st["state"] == "cancelled" and st["finished"] is not None
    assert c.get("/training/status/latest", headers=AUTH).json()["job_id"] == job_id
    time.sleep(0.5)  # a late writer would show up now
    after = model_dirs(js.store)
    assert [d for d in after if not d.startswith(".tmp-")] == before
    assert js.store.active_version() == VA and served_version(c) == VA
    assert c.delete(f"/training/{job_id}", headers=AUTH).json()["state"] == "cancelled"  # idempotent


# --------------------------------------------------------------------------------------
# A job that succeeds and is activated
# --------------------------------------------------------------------------------------


def test_a_job_failed_by_its_data_is_a_warning_not_an_error(js: JobServer) -> None:
    """A file without a price column fails the job (the status says why), and the log says so at WARNING: the
    service is fine, so an operator's alert on ERROR lines is not woken by a client's bad file."""
    data_dir = js.srv.state_dir.parent / "data"
    (data_dir / "no_price.csv").write_text("timestamp,volume\n1640995200000,1\n1640995201000,2\n")
    before = jobs_ended(js.client)
    r = js.client.post("/training", json={"files": ["no_price.csv"]}, headers=AUTH)
    assert r.status_code == 202, r.text
    st, _ = wait_final(js, r.json()["job_id"])
    assert st["state"] == "failed" and "price" in st["error"], st
    # the one signal Prometheus has of it (alert CerebellarNorseTrainingJobFailed): /health and training_loss say nothing
    assert jobs_ended(js.client) == {**before, "failed": before["failed"] + 1}
    lines = [json.loads(line) for line in js.srv.log().splitlines()
             if '"training job failed"' in line and st["job_id"] in line]
    assert [rec["level"] for rec in lines] == ["WARNING"], lines


def test_a_job_can_start_from_scratch_as_train_can(js: JobServer) -> None:
    """A job started from the active model's weights, and its in-sample warning told to train with --from-scratch,
    which a job could not ask for; "from_scratch": true starts it from the config's seed (a string is refused)."""
    c = js.client
    r = c.post("/training", json={"files": ["small.csv"], "from_scratch": "yes"}, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"]["field"] == "from_scratch", r.text
    r = c.post("/training", json={"files": ["small.csv"], "epochs": 1, "activate": "never", "from_scratch": True},
               headers=AUTH)
    assert r.status_code == 202, r.text
    st, seen = wait_final(js, r.json()["job_id"])
    assert seen[-1] == "succeeded", (seen, st)
    assert js.store.active_version() is not None  # an active model there was to start from
    metrics = js.store.load(st["model_version"]).metrics
    assert metrics["started"] == "from scratch (--from-scratch)" and "lineage" not in metrics


def test_job_runs_to_success_and_its_model_is_activated(js: JobServer) -> None:
    c = js.client
    before = jobs_ended(c)
    r = c.post("/training", json={"files": ["small.csv"], "epochs": 1, "activate": "always"}, headers=AUTH)
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    assert r.json()["status_url"] == f"/training/status/{job_id}"
    st, seen = wait_final(js, job_id, by_latest=True)
    assert seen[0] == "running" and seen[-1] == "succeeded", (seen, st)
    assert st["error"] is None and st["progress"] == 1.0 and st["epoch"] == 1
    assert len(st["loss_history"]) == 1 and math.isfinite(st["loss_history"][0])
    val = st["validation"]
    for key in ("loss", "accuracy", "directional_accuracy", "majority_baseline_accuracy", "recall", "samples"):
        assert key in val, key
    assert val["samples"] > 500
    assert st["validation_history"] and st["validation_history"][-1]["loss"] == pytest.approx(val["loss"])
    old = st["active_model_validation"]
    assert old is not None and old["samples"] == val["samples"]  # the active model scored on the same split
    assert st["edge"] in ("none", "flat", "direction") and val["edge"] == st["edge"]
    assert st["test"]["samples"] > 0 and {"base_rates", "logistic"} <= set(st["test"]["baselines"])
    new = st["model_version"]
    # what the test split supports, as evaluate says it (the status carries the stored model's verdict)
    assert st["test"]["verdict"] == js.store.load(new).metrics["test"]["verdict"]
    assert st["test"]["verdict"]["action"] in ("do_not_trade", "collect_more_data") and st["test"]["verdict"]["reason"]
    assert new and new not in (VA, VB, VC)
    assert new in model_dirs(js.store)
    assert st["activated"] is True
    assert served_version(c) == new
    assert js.store.active_version() == new

    metrics = c.get("/metrics").text
    m = re.search(r"^training_loss ([0-9.eE+-]+)$", metrics, re.M)
    assert m is not None, metrics[:2000]
    assert float(m.group(1)) == pytest.approx(st["loss"]) and float(m.group(1)) > 0
    assert jobs_ended(c) == {**before, "succeeded": before["succeeded"] + 1}

    listed = c.get("/models", headers=AUTH).json()
    assert listed["active"] == new
    by_version = {m["version"]: m for m in listed["models"]}
    assert by_version[new]["valid"] and by_version[new]["validation"]["loss"] == pytest.approx(val["loss"])
    # what a client serving it needs to know: whether it found an edge, and what its test split supports
    assert by_version[new]["edge"] == st["edge"] and by_version[new]["verdict"] == st["test"]["verdict"]
    assert by_version[VC]["valid"] is False and "weights.npz" in by_version[VC]["error"]


# --------------------------------------------------------------------------------------
# Activation
# --------------------------------------------------------------------------------------


def test_activating_a_corrupt_or_unknown_model_is_refused(js: JobServer) -> None:
    c = js.client
    current = served_version(c)
    assert current not in (VB, VC)
    r = c.post(f"/models/{VC}/activate", headers=AUTH)
    assert r.status_code == 422, r.text
    assert "weights.npz" in r.json()["error"]["message"] and r.json()["error"]["field"] == "version"
    r = c.post("/models/20990101T000000Z-none00/activate", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["field"] == "version"
    r = c.post("/models/..%2F..%2Fetc/activate", headers=AUTH)
    assert 400 <= r.status_code < 500
    assert served_version(c) == current and js.store.active_version() == current


def test_activation_that_cannot_write_active_changes_nothing(js: JobServer) -> None:
    c = js.client
    current = served_version(c)
    assert current != VB
    active = js.store.root / "ACTIVE"
    saved = active.read_bytes()
    active.unlink()
    active.mkdir()  # models/ACTIVE cannot be replaced by a file
    try:
        r = c.post(f"/models/{VB}/activate", headers=AUTH)
        assert r.status_code == 503, r.text
        assert f"cannot write {active}" in r.json()["error"]["message"]
        assert served_version(c) == current
    finally:
        active.rmdir()
        active.write_bytes(saved)
    assert js.store.active_version() == current


def test_hot_swap_under_load_loses_no_request(js: JobServer) -> None:
    old = served_version(js.client)
    lanes, per_lane, swap_after = 3, 150, 60

    async def run() -> tuple[list[list[tuple[int, str]]], httpx.Response]:
        done = [0]
        swapped = asyncio.Event()

        async def lane(k: int) -> list[tuple[int, str]]:
            out = []
            market = f"swap-{k}"
            async with httpx.AsyncClient(base_url=js.srv.url, timeout=30.0) as ac:
                for i in range(per_lane):
                    body = {"price": 100.0 + 0.1 * ((i * 7) % 11), "volume": 1000.0 + i, "timestamp": T0 + 1000 * i,
                            "market_id": market}
                    r = await ac.post("/neural/process", json=body)
                    out.append((r.status_code, r.json().get("model_version", "") if r.status_code == 200 else r.text))
                    done[0] += 1
                    if i == per_lane - 40:
                        await asyncio.wait_for(swapped.wait(), 60)  # keep sending after the swap
            return out

        async def swap() -> httpx.Response:
            while done[0] < swap_after:
                await asyncio.sleep(0.001)
            async with httpx.AsyncClient(base_url=js.srv.url, timeout=30.0, headers=AUTH) as ac:
                r = await ac.post(f"/models/{VB}/activate")
            swapped.set()
            return r

        results = await asyncio.gather(*(lane(k) for k in range(lanes)), swap())
        return list(results[:lanes]), results[-1]  # type: ignore[return-value]

    lane_results, swap_response = asyncio.run(run())
    assert swap_response.status_code == 200, swap_response.text
    assert swap_response.json()["active"] == VB
    for res in lane_results:
        assert len(res) == per_lane
        assert all(code == 200 for code, _ in res), [r for r in res if r[0] != 200][:3]
        versions = [v for _, v in res]
        assert set(versions) <= {old, VB}, set(versions)
        assert versions[0] == old and versions[-1] == VB
        first_new = versions.index(VB)
        assert all(v == VB for v in versions[first_new:])  # never back to the old model
    assert served_version(js.client) == VB and js.store.active_version() == VB


def test_auto_activation_needs_a_directional_edge(make_config: ConfigFactory) -> None:
    from cerebellar_norse.training.jobs import JobManager, JobStatus

    activated: list[str] = []
    mgr = JobManager(make_config(), activated.append, lambda loss: None)
    for edge, expect in (("none", False), ("flat", False), ("direction", True)):
        job = JobStatus(job_id=f"j{edge}", state="running")
        res = {"model_version": f"v-{edge}", "validation": {"loss": 1.0}, "active_model_validation": {"loss": 1.1},
               "edge": edge, "test": {}}
        mgr._on_success(job, res, "auto")
        assert job.activated is expect and job.state == "succeeded"
        assert (f"v-{edge}" in activated) is expect
        if not expect:
            assert any("no directional edge" in w for w in job.warnings)
    job = JobStatus(job_id="jalways", state="running")
    mgr._on_success(job, {"model_version": "v-always", "validation": {"loss": 2.0}, "edge": "none"}, "always")
    assert job.activated and "v-always" in activated


def test_auto_activation_skips_a_job_whose_comparison_an_operator_activation_made_stale(
        make_config: ConfigFactory) -> None:
    """The job beat the model active when it started; an operator activated another one while it ran. Auto-activation
    would replace the operator's choice on a comparison with a model no longer served: the model is kept inactive,
    saying why. Unchanged, it is activated."""
    from cerebellar_norse.training.jobs import JobManager

    cfg = make_config()
    store = ModelStore(cfg.paths.state_dir)
    store.root.mkdir(parents=True)
    store.set_active("20240101T000000Z-aaaaaa")
    activated: list[str] = []
    mgr = JobManager(cfg, activated.append, lambda loss: None)
    res = {"validation": {"loss": 1.0}, "active_model_validation": {"loss": 1.1}, "edge": "direction", "test": {}}
    mgr._active_at_start = "20240101T000000Z-aaaaaa"  # what models/ACTIVE named when JobManager.start ran
    store.set_active("20240102T000000Z-bbbbbb")  # POST /models/{version}/activate while the job runs
    job = JobStatus(job_id="kept", state="running")
    mgr._on_success(job, {**res, "model_version": "v-kept"}, "auto")
    assert job.state == "succeeded" and not job.activated and activated == []
    assert any("the active model changed while the job ran" in w and "20240102T000000Z-bbbbbb" in w
               for w in job.warnings), job.warnings
    mgr._active_at_start = "20240102T000000Z-bbbbbb"  # the next job: no activation while it runs
    job = JobStatus(job_id="swapped", state="running")
    mgr._on_success(job, {**res, "model_version": "v-swapped"}, "auto")
    assert job.state == "succeeded" and job.activated and activated == ["v-swapped"]


@pytest.mark.parametrize("failure", [BlockingIOError(11, "Resource temporarily unavailable"),
                                     RuntimeError("can't start new thread")], ids=["EAGAIN", "no thread"])
def test_a_job_whose_process_cannot_start_is_refused_for_now_and_leaves_no_job_behind(
        make_config: ConfigFactory, ticks_csv: CsvFactory, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, failure: Exception) -> None:
    """The host has no process to give (fork EAGAIN at the task limit) or no thread: 503 capacity with Retry-After,
    one WARNING, and no job recorded. (The job was left "queued" for ever: every later request was a 409 conflict
    naming a job that never ran, until a restart.)"""
    from cerebellar_norse.errors import CapacityError
    from cerebellar_norse.training.jobs import JobManager

    cfg = make_config()
    ticks_csv(50, 1, name="t.csv")
    mgr = JobManager(cfg, lambda version: None, lambda loss: None)

    def no_process(*_args: object, **_kwargs: object) -> None:
        raise failure

    from cerebellar_norse.training import jobprocess

    monkeypatch.setattr(jobprocess.subprocess, "Popen", no_process)
    open_before = len(os.listdir("/proc/self/fd"))

    async def refused() -> CapacityError:
        try:
            with caplog.at_level(logging.WARNING, logger="cerebellar_norse"), pytest.raises(CapacityError) as caught:
                mgr.start(TrainingRequest.model_validate({"files": ["t.csv"]}))
        finally:
            await mgr.close()
        return caught.value

    err = asyncio.run(refused())
    assert err.retry_after_s >= 1 and "cannot start the training job's process" in str(err)
    assert mgr.jobs == {} and mgr.latest is None and not mgr.busy
    assert len(os.listdir("/proc/self/fd")) == open_before  # the pipes made for it are closed
    assert [r.levelno for r in caplog.records if r.levelno >= logging.WARNING] == [logging.WARNING]  # (INFO: others')


@pytest.mark.parametrize("text", ["[]", '{"job_id": 5, "state": "done", "created": 7}', "{", "[" * 50_000 + "]" * 50_000,
                                  '{"job_id": "j1"}', '{"job_id": "j2", "state": "succeeded", "loss_history": 5}',
                                  '{"job_id": "j3", "state": "succeeded", "validation": [1]}',
                                  '{"job_id": "j4", "state": "finished"}', '{"job_id": "j5", "state": "failed", "report": "x"}'])
def test_a_damaged_job_record_is_skipped_not_fatal(make_config: ConfigFactory, caplog: pytest.LogCaptureFixture,
                                                   text: str) -> None:
    """The service reads every job record at start: a damaged one loses its history only, never the start."""
    from cerebellar_norse.training.jobs import JobManager

    cfg = make_config()
    jobs = Path(cfg.paths.state_dir) / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / "bad.json").write_text(text)
    (jobs / "good.json").write_text(json.dumps({"job_id": "good", "state": "succeeded", "created": "2026-11-25T10:00:00Z"}))
    with caplog.at_level(logging.WARNING, logger="cerebellar_norse"):
        mgr = JobManager(cfg, lambda version: None, lambda loss: None)
    assert set(mgr.jobs) == {"good"}
    assert any("ignoring unreadable job record" in r.getMessage() and "bad.json" in r.getMessage() for r in caplog.records)
    assert mgr.jobs["good"].as_dict()["state"] == "succeeded"  # what the status route answers


def test_a_job_that_stored_its_model_before_the_service_died_says_so(make_config: ConfigFactory,
                                                                       ticks_csv: CsvFactory) -> None:
    """The service died (kill -9) after the job process stored its model but before the job's end was recorded:
    the record, failed at the next start, names that model instead of claiming that none was written."""
    from cerebellar_norse.training.jobs import JobManager

    cfg = make_config(neural=TINY_NEURAL)
    res = run_training(cfg, [ticks_csv(800, 2, seed=2)], 1, lambda d: None, lambda: False, job_id="stored1")
    store = ModelStore(cfg.paths.state_dir)
    assert store.load(res["model_version"]).metrics["job_id"] == "stored1"
    jobs = Path(cfg.paths.state_dir) / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    for jid in ("stored1", "died2"):  # as JobManager.start writes them: running, then the service is gone
        (jobs / f"{jid}.json").write_text(json.dumps({"job_id": jid, "state": "running", "files": ["t.csv"],
                                                       "created": "2026-11-25T10:00:00Z"}))
    ended: list[str] = []
    (jobs / "done3.json").write_text(json.dumps({"job_id": "done3", "state": "succeeded", "files": ["t.csv"]}))
    mgr = JobManager(cfg, lambda version: None, lambda loss: None, ended.append)
    assert ended == ["failed", "failed"]  # the two left running count as failed jobs (the metric); the finished one not again
    stored, died = mgr.jobs["stored1"].as_dict(), mgr.jobs["died2"].as_dict()
    assert stored["state"] == "failed" and stored["model_version"] == res["model_version"] and not stored["activated"]
    assert "wrote no model" not in stored["error"] and f"stored its model {res['model_version']}" in stored["error"]
    assert died["state"] == "failed" and died["model_version"] is None and "wrote no model" in died["error"]
    again = JobManager(cfg, lambda version: None, lambda loss: None)  # the rewritten record reads back the same
    assert again.jobs["stored1"].as_dict()["error"] == stored["error"]


def test_a_job_left_running_by_a_stopped_service_is_logged_as_failed_at_the_next_start(
        make_config: ConfigFactory, caplog: pytest.LogCaptureFixture) -> None:
    """The job a crashed service left running ends "failed" at the next start: counted (the alert), and logged as a
    job that fails while the service runs is (ERROR ``training job failed`` with its id and error), which the alert's
    ``journalctl … | grep 'training job failed'`` and ``journalctl -p err`` find; a finished job is not logged again."""
    from cerebellar_norse.training.jobs import JobManager

    cfg = make_config(neural=TINY_NEURAL)
    jobs = Path(cfg.paths.state_dir) / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / "died1.json").write_text(json.dumps({"job_id": "died1", "state": "running", "files": ["t.csv"]}))
    (jobs / "done2.json").write_text(json.dumps({"job_id": "done2", "state": "failed", "files": ["t.csv"],
                                                  "error": "earlier"}))
    with caplog.at_level(logging.INFO, logger="cerebellar_norse.training"):
        JobManager(cfg, lambda version: None, lambda loss: None)
    (rec,) = [r for r in caplog.records if r.getMessage() == "training job failed"]
    assert rec.levelno == logging.ERROR
    fields = rec.fields  # type: ignore[attr-defined]
    assert fields["job_id"] == "died1" and "the service stopped while the job was running" in fields["error"]
    assert fields["model_version"] is None and fields["activated"] is False
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cerebellar_norse.training"):
        JobManager(cfg, lambda version: None, lambda loss: None)  # its record now says failed: not logged again
    assert not [r for r in caplog.records if r.getMessage() == "training job failed"]


def test_a_cancel_that_reaches_a_job_after_it_stored_its_model_names_the_model(make_config: ConfigFactory) -> None:
    """DELETE /training/{id} while the job saves: the process ends on its own, its "succeeded" not yet read. The job
    is cancelled, and its status (and record, after a restart) names the stored model, not activated, instead of
    claiming that none was written."""
    from cerebellar_norse.training.jobs import JobManager

    cfg = make_config()
    activated: list[str] = []
    store = ModelStore(cfg.paths.state_dir)
    version = store.save(generate_weights(cfg), cfg, {"job_id": "late1"})
    mgr = JobManager(cfg, activated.append, lambda loss: None)
    mgr.jobs["late1"] = JobStatus(job_id="late1", state="running", files=["t.csv"])
    st = asyncio.run(mgr.cancel("late1")).as_dict()
    assert st["state"] == "cancelled" and st["model_version"] == version and not st["activated"] and not activated
    assert f"stored its model {version}" in st["error"] and f"POST /models/{version}/activate" in st["error"]
    again = JobManager(cfg, lambda version: None, lambda loss: None).jobs["late1"].as_dict()
    assert (again["state"], again["model_version"], again["error"]) == ("cancelled", version, st["error"])


class FakeJobProcess:
    """A job process as JobManager sees it (and its stop event). ``stops``: asked to stop, it reports "cancelled" at
    its next step and exits once that report was read; else it stops only when terminated, which takes a moment (a
    process busy loading its files)."""

    def __init__(self, out: Any, job: JobStatus, stops: bool) -> None:
        self.out, self.job, self.stops = out, job, stops
        self.terminated = False
        self.exitcode: int | None = None

    def set(self) -> None:  # the stop event
        if self.stops:
            self.out.put(("cancelled", {}))

    def is_alive(self) -> bool:
        return not self.terminated and not (self.stops and self.job.state != "running")

    def terminate(self) -> None:
        time.sleep(0.3)
        self.terminated, self.exitcode = True, -15


def run_and_cancel(mgr: Any, job_id: str, stops: bool, at_shutdown: bool, deleted_meanwhile: bool = False) -> None:
    """A job of ``mgr`` running (its progress read by JobManager._monitor), then cancelled: by DELETE, or by the
    service stopping (with a DELETE arriving while it waits for the job, when ``deleted_meanwhile``)."""
    import queue

    async def scenario() -> None:
        out: Any = queue.Queue()
        job = mgr.jobs[job_id] = JobStatus(job_id=job_id, state="running", files=["t.csv"], epoch=1 if stops else 0)
        mgr.latest = job_id
        mgr._proc = mgr._stop = FakeJobProcess(out, job, stops)
        mgr._task = asyncio.get_running_loop().create_task(mgr._monitor(job, out, "auto"))
        await asyncio.sleep(0.3)

        async def delete_soon() -> None:
            await asyncio.sleep(0.05)
            await mgr.cancel(job_id)

        await asyncio.gather(mgr.close() if at_shutdown else mgr.cancel(job_id),
                             *([delete_soon()] if deleted_meanwhile else []))

    asyncio.run(scenario())


def test_a_job_that_has_not_reached_its_first_step_is_stopped_at_once(make_config: ConfigFactory) -> None:
    """DELETE in a job's first seconds (its imports, reading its files) waited the whole grace for a step that checks
    the stop flag (5 s: past a client's default timeout), then terminated it; it is terminated at once now."""
    import queue

    from cerebellar_norse.training import jobs
    from cerebellar_norse.training.jobs import JobManager

    async def scenario() -> JobStatus:
        mgr = JobManager(make_config(), lambda version: None, lambda loss: None)
        job = mgr.jobs["load1"] = JobStatus(job_id="load1", state="running", files=["t.csv"])
        mgr._proc = mgr._stop = proc = FakeJobProcess(queue.Queue(), job, stops=False)
        done = await asyncio.wait_for(mgr.cancel("load1"), 60)  # (the grace below would be 10 minutes)
        assert proc.terminated
        return done

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jobs, "CANCEL_GRACE_S", 600.0)
        st = asyncio.run(scenario()).as_dict()
    assert (st["state"], st["model_version"]) == ("cancelled", None)


def test_a_job_cancelled_by_the_service_stopping_says_so_after_a_restart(make_config: ConfigFactory) -> None:
    """SIGTERM during a job: the job is cancelled at shutdown, and its record tells that the service stopping
    cancelled it (no client did), and that no model was written."""
    from cerebellar_norse.training.jobs import JobManager

    cfg = make_config()
    mgr = JobManager(cfg, lambda version: None, lambda loss: None)
    mgr.jobs["stop0"] = JobStatus(job_id="stop0", state="running", files=["t.csv"])  # no process: before it started
    asyncio.run(mgr.close())
    run_and_cancel(mgr, "stop1", stops=True, at_shutdown=True)  # the job process stops itself and says so
    with pytest.MonkeyPatch.context() as mp:
        from cerebellar_norse.training import jobs

        mp.setattr(jobs, "CANCEL_GRACE_S", 0.2)
        run_and_cancel(mgr, "stop2", stops=False, at_shutdown=True, deleted_meanwhile=True)  # still loading
    again = JobManager(cfg, lambda version: None, lambda loss: None)
    for jid in ("stop0", "stop1", "stop2"):
        st = again.jobs[jid].as_dict()
        assert (st["state"], st["model_version"]) == ("cancelled", None)
        assert st["error"] and "the service stopped" in st["error"] and "no model" in st["error"], st["error"]


@pytest.mark.parametrize("stops", [True, False])
def test_a_cancelled_job_is_recorded_cancelled_whoever_sees_its_end_first(make_config: ConfigFactory,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         stops: bool) -> None:
    """DELETE of a job that stops at its next step, or of one that must be terminated (loading its files): cancelled,
    with no error, never "failed: training process exited with code -15" when the job's monitor saw the terminated
    process before the cancel recorded it."""
    from cerebellar_norse.training import jobs
    from cerebellar_norse.training.jobs import JobManager

    monkeypatch.setattr(jobs, "CANCEL_GRACE_S", 0.2, raising=False)
    mgr = JobManager(make_config(), lambda version: None, lambda loss: None)
    run_and_cancel(mgr, "del1", stops=stops, at_shutdown=False)
    st = mgr.jobs["del1"].as_dict()
    assert (st["state"], st["error"], st["model_version"]) == ("cancelled", None, None), st


def test_a_finished_job_read_back_after_a_restart_keeps_its_times(make_config: ConfigFactory) -> None:
    """docs/training.md: finished jobs are answered after a restart, with ISO-8601 created/started/finished. The record
    on disk held all three, but the status answered after a restart had started and finished null."""
    from cerebellar_norse.training.jobs import JobManager

    cfg = make_config()
    jobs = Path(cfg.paths.state_dir) / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    times = {"created": "2026-11-25T10:00:00Z", "started": "2026-11-25T10:00:01Z", "finished": "2026-11-25T10:05:00Z"}
    (jobs / "done.json").write_text(json.dumps({"job_id": "done", "state": "succeeded", "files": ["t.csv"], **times}))
    answered = JobManager(cfg, lambda version: None, lambda loss: None).jobs["done"].as_dict()
    assert {k: answered[k] for k in times} == times


def test_eta_counts_the_epochs_pace_not_the_loading_before_them() -> None:
    """A job that spent a minute loading a large file then ran 10 % of its epochs in 10 s has about 90 s left: the
    ETA was the whole time since the job started (loading included) times what is left over what is done, 630 s."""
    from cerebellar_norse.training.jobs import eta_s

    loaded = 1060.0  # time.monotonic() of the first step's report, 60 s after the job started
    assert eta_s((loaded, 0.01), loaded, 0.01) is None  # one report gives no pace
    assert eta_s((loaded, 0.01), loaded + 10.0, 0.11) == pytest.approx(10.0 * 0.89 / 0.10)
    assert eta_s((loaded, 0.01), loaded + 99.0, 1.0) == 0.0


def test_a_cancel_kills_a_stopped_job_process(make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """DELETE of a job whose process is stopped (``kill -STOP``, a cgroup freezer): SIGTERM stays pending in a stopped
    process, so the cancel answered "cancelled" while the process lived on, able to write its model once continued
    (and the service's stop hung waiting for it). The process is killed (SIGKILL) when SIGTERM does not end it."""
    import multiprocessing
    import os
    import signal

    from cerebellar_norse.training import jobs
    from cerebellar_norse.training.jobs import JobManager

    monkeypatch.setattr(jobs, "CANCEL_GRACE_S", 0.2)
    monkeypatch.setattr(jobs, "KILL_GRACE_S", 0.5, raising=False)
    mgr = JobManager(make_config(), lambda version: None, lambda loss: None)
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=time.sleep, args=(600.0,), daemon=True)  # a job process, busy between two steps
    proc.start()
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline, "the process did not stop"
            time.sleep(0.01)
        mgr.jobs["frozen1"] = JobStatus(job_id="frozen1", state="running", files=["t.csv"], epoch=1)
        mgr.latest, mgr._proc, mgr._stop = "frozen1", proc, ctx.Event()
        st = asyncio.run(asyncio.wait_for(mgr.cancel("frozen1"), 30)).as_dict()
        assert not proc.is_alive(), "the cancelled job's process is still there"
        assert proc.exitcode == -signal.SIGKILL
        assert (st["state"], st["error"], st["model_version"]) == ("cancelled", None, None), st
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


SENDS_A_LARGE_RESULT = """
import time

def job(out, stop):
    out.put(("succeeded", {"model_version": "x" * 4_000_000}))  # 4 MB: fills the pipe (64 KiB), waits for the reader
    time.sleep(600)
"""

KILLED_MID_RESULT = """
import asyncio, os, signal, sys, time
from cerebellar_norse.config import load_config
from cerebellar_norse.training.jobprocess import start_job_process
from cerebellar_norse.training.jobs import JobManager, JobStatus

if __name__ == "__main__":
    mgr = JobManager(load_config(None, environ={"CEREBELLAR_NORSE_PATHS__STATE_DIR": sys.argv[1]}), print, print)
    sys.path.insert(0, sys.argv[2])  # (the job process takes this sys.path)
    proc, out, stop = start_job_process("large_result:job", ())
    while not out._conn.poll(0.05):
        pass
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)  # in the middle of its result
    proc.join()
    job = mgr.jobs["cut1"] = JobStatus(job_id="cut1", state="running", files=["t.csv"])
    mgr.latest, mgr._proc, mgr._stop = "cut1", proc, stop
    asyncio.run(asyncio.wait_for(mgr._monitor(job, out, "auto"), 20))
    print("RESULT", job.state, job.model_version, job.error, flush=True)
    os._exit(0)
"""


def test_a_job_process_killed_in_the_middle_of_its_result_is_recorded_failed(tmp_path: Path) -> None:
    """A job process killed (SIGKILL, the OOM killer) while its result, larger than the pipe holds, was being sent:
    the service's read waited for the rest for good, the job stayed "running" (every further job 409) and the
    service's stop hung on that read. The service holds no write end of the report pipe once the process started
    (jobprocess.start_job_process), so the read ends, and the job is recorded failed with the process's exit. Run in a
    process of its own: the read that never ends would hang the test's process."""
    import subprocess
    import sys

    from training_helpers import REPO_ROOT

    (tmp_path / "large_result.py").write_text(SENDS_A_LARGE_RESULT)
    try:
        res = subprocess.run([sys.executable, "-c", KILLED_MID_RESULT, str(tmp_path / "state"), str(tmp_path)],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError("the job's monitor waited for the rest of a killed process's result") from None
    results = [line for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    assert results == ["RESULT failed None training process exited with code -9"], (res.stdout[-2000:],
                                                                                      res.stderr[-2000:])
