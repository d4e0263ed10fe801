"""SIGHUP reloads the config file: live-safe keys apply, others are reported as needing a restart."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cerebellar_norse.api.deps import ServiceState
from cerebellar_norse.api.lifecycle import LIVE_KEYS, changed_keys, reload_config
from cerebellar_norse.api.server import build_service
from cerebellar_norse.config import load_checked_config, load_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.ticks import Tick
from cerebellar_norse.training.checkpoints import ModelStore
from cerebellar_norse.training.jobs import JobStatus
from cerebellar_norse.wakeup import host_limit_us

BASE = """
[server]
port = {port}
[performance]
queue_size = 4096
[logging]
level = "INFO"
"""
ACTIVE, TRAINED = "20240101T000000Z-aaaaaa", "20240102T000000Z-bbbbbb"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_changed_keys_lists_dotted_keys(tmp_path: Path) -> None:
    a = load_config(environ={})
    b = load_config(environ={"CEREBELLAR_NORSE_LOGGING__LEVEL": "DEBUG", "CEREBELLAR_NORSE_NEURAL__GRANULE_SIZE": "256",
                             "CEREBELLAR_NORSE_SERVER__API_TOKEN": "t"})
    assert changed_keys(a, b) == ["logging.level", "neural.granule_size", "server.api_token"]
    assert "logging.level" in LIVE_KEYS and "neural.granule_size" not in LIVE_KEYS


@contextlib.contextmanager
def _service(tmp_path: Path, cfg: Path, port: int, *args: str,
             extra_env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """The service on ``cfg`` (plus ``args`` and ``extra_env``) in a process of its own, once /health on ``port``
    answers 200; killed on the way out if a test left it running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEREBELLAR_NORSE_")}
    env.update(CEREBELLAR_NORSE_PATHS__STATE_DIR=str(tmp_path / "state"), CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN="false")
    env.update(extra_env or {})
    proc = subprocess.Popen([sys.executable, "-m", "cerebellar_norse.cli", "--config", str(cfg), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"service did not become ready: {proc.communicate()[0][-3000:]}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _stop(proc: subprocess.Popen[str]) -> tuple[str, list[dict[str, Any]]]:
    """SIGTERM, a clean exit, and the service's output: whole and as its JSON log lines."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return out, [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def test_sighup_applies_live_keys_and_reports_the_rest(tmp_path: Path) -> None:
    port = _free_port()
    cfg = tmp_path / "service.toml"
    cfg.write_text(BASE.format(port=port))
    with _service(tmp_path, cfg, port) as proc:
        cfg.write_text(BASE.format(port=port).replace("queue_size = 4096", "queue_size = 1000\nmax_markets = 8\nbusy_poll_us = 2000")
                       .replace('level = "INFO"', 'level = "DEBUG"'))
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()["queue_capacity"] == 1000:
                break
            time.sleep(0.1)
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()
        assert health["queue_capacity"] == 1000
        assert health["pool"]["capacity"] != 8  # max_markets needs a restart
        effective = httpx.get(f"http://127.0.0.1:{port}/debug/config", timeout=5).json()
        assert effective["need_restart"] == ["performance.max_markets"]  # pending, and said so
        assert effective["config"]["performance"]["max_markets"] == 1024
        assert effective["config"]["performance"]["queue_size"] == 1000
        cfg.write_text("[server\n")  # invalid: refused, running config kept
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        out, lines = _stop(proc)
    reloaded = [x for x in lines if x["message"] == "config reloaded"]
    assert reloaded, out
    assert set(reloaded[0]["fields"]["applied"]) == {"logging.level", "performance.queue_size", "performance.busy_poll_us"}
    assert reloaded[0]["fields"]["need_restart"] == ["performance.max_markets"]
    assert any(x["message"].startswith("config reload refused") for x in lines)


def _reload_to(proc: subprocess.Popen[str], port: int, cfg: Path, text: str, queue_size: int) -> None:
    """Write ``text`` to ``cfg``, SIGHUP, and wait until /health shows the reloaded ``queue_size``."""
    cfg.write_text(text)
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()["queue_capacity"] != queue_size:
        time.sleep(0.1)


def test_a_replica_reload_warns_only_of_an_overridden_key_the_file_changed(tmp_path: Path) -> None:
    """A replica's unit sets server.port (and its state dir, drain and log file) by variables at every start, to
    other values than the shared file: every reload warned of them as if the operator had just changed the file in
    vain. They stay listed in ``overridden``; the WARNING names only a key whose value in the file changed since
    the service last read it (at start or the last reload)."""
    port = _free_port()
    cfg = tmp_path / "service.toml"
    shared = BASE.format(port=_free_port())  # the file's port is not the replica's
    cfg.write_text(shared)
    poll = "CEREBELLAR_NORSE_PERFORMANCE__BUSY_POLL_US"
    with _service(tmp_path, cfg, port, extra_env={"CEREBELLAR_NORSE_SERVER__PORT": str(port), poll: "0"}) as proc:
        _reload_to(proc, port, cfg, shared.replace("queue_size = 4096", "queue_size = 1000"), 1000)
        _reload_to(proc, port, cfg, shared.replace("queue_size = 4096", "queue_size = 1500\nbusy_poll_us = 2000"), 1500)
        _reload_to(proc, port, cfg, shared.replace("queue_size = 4096", "queue_size = 2000\nbusy_poll_us = 2000"), 2000)
        out, lines = _stop(proc)
    reloaded = [x for x in lines if x["message"] == "config reloaded"]
    assert [x["fields"] for x in reloaded] == [
        {"applied": ["performance.queue_size"], "need_restart": [], "overridden": ["server.port"]},
        {"applied": ["performance.queue_size"], "need_restart": [], "overridden": ["performance.busy_poll_us", "server.port"]},
        {"applied": ["performance.queue_size"], "need_restart": [], "overridden": ["performance.busy_poll_us", "server.port"]},
    ], out
    warned = [x for x in lines if x["level"] == "WARNING" and "overridden_by" in x.get("fields", {})]
    assert [x["fields"]["overridden_by"] for x in warned] == [{"performance.busy_poll_us": poll}], out
    assert "server.port" not in warned[0]["message"]


JOB_TOML = """
[paths]
state_dir = "{state_dir}"
[training]
bootstrap_on_first_run = false
auto_activate = {auto}
"""


def test_reloaded_auto_activate_governs_the_jobs_that_finish_after_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's job manager follows a reload of ``training.auto_activate`` (the SIGHUP handler, in process)."""
    for k in [k for k in os.environ if k.startswith("CEREBELLAR_NORSE_")]:
        monkeypatch.delenv(k)
    state_dir = tmp_path / "state"
    cfg_path = tmp_path / "service.toml"
    cfg_path.write_text(JOB_TOML.format(state_dir=state_dir, auto="true"))
    cfg = load_checked_config(cfg_path)
    store = ModelStore(state_dir)
    weights = generate_weights(cfg)
    store.save(weights, cfg, {"validation": {"loss": 1.1}}, version=ACTIVE)
    store.save(weights, cfg, {"validation": {"loss": 1.0}}, version=TRAINED)
    store.set_active(ACTIVE)
    root_level = logging.getLogger().level
    state = build_service(cfg)
    try:
        jobs = state.jobs
        assert state.engine.model_version == ACTIVE

        def finish_job(job_id: str) -> JobStatus:
            """A job whose model beats the active one with a directional edge: the case auto_activate decides."""
            job = JobStatus(job_id=job_id, state="running")
            jobs._active_at_start = store.active_version()  # as when the job was submitted: the model it is compared with
            jobs._on_success(job, {"model_version": TRAINED, "validation": {"loss": 1.0},
                                   "active_model_validation": {"loss": 1.1}, "edge": "direction", "test": {}}, "auto")
            return job

        cfg_path.write_text(JOB_TOML.format(state_dir=state_dir, auto="false"))
        reload_config(state, str(cfg_path))
        assert state.cfg.training.auto_activate is False
        kept = finish_job("kept")
        assert kept.state == "succeeded" and not kept.activated
        assert any("training.auto_activate is false" in w for w in kept.warnings), kept.warnings
        assert state.engine.model_version == ACTIVE and store.active_version() == ACTIVE

        cfg_path.write_text(JOB_TOML.format(state_dir=state_dir, auto="true"))
        reload_config(state, str(cfg_path))
        swapped = finish_job("swapped")
        assert swapped.activated and not swapped.warnings
        assert state.engine.model_version == TRAINED and store.active_version() == TRAINED
    finally:
        logging.getLogger().setLevel(root_level)


PERFORMANCE_TOML = """
[paths]
state_dir = "{state_dir}"
[training]
bootstrap_on_first_run = false
[performance]
{settings}
"""


@contextlib.contextmanager
def reloadable_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: str) -> Iterator[tuple[ServiceState, Callable[[str], None]]]:
    """A service built from a config file with these ``[performance]`` lines, and a function that rewrites them and reloads."""
    for k in [k for k in os.environ if k.startswith("CEREBELLAR_NORSE_")]:
        monkeypatch.delenv(k)
    cfg_path = tmp_path / "service.toml"

    def write(lines: str) -> None:
        cfg_path.write_text(PERFORMANCE_TOML.format(state_dir=tmp_path / "state", settings=lines))

    def reload(lines: str) -> None:
        write(lines)
        reload_config(state, str(cfg_path))

    write(settings)
    root_level = logging.getLogger().level
    state = build_service(load_checked_config(cfg_path))
    try:
        yield state, reload
    finally:
        logging.getLogger().setLevel(root_level)


@pytest.mark.asyncio
@pytest.mark.usefixtures("cpus_free")
async def test_reloaded_busy_poll_us_governs_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``performance.busy_poll_us`` applies on reload: the next batch polls (or not) by the new value."""
    with reloadable_service(tmp_path, monkeypatch, "busy_poll_us = 0") as (state, reload):
        eng = state.engine
        await eng.submit(Tick(100.0, 1.0, 1_700_000_000_000, "A"))
        assert not eng.polling
        reload("busy_poll_us = 5000000")
        assert state.cfg.performance.busy_poll_us == 5_000_000
        await eng.submit(Tick(100.0, 1.0, 1_700_000_000_001, "A"))
        assert eng.polling
        reload("busy_poll_us = 0")
        await asyncio.sleep(0.01)
        assert not eng.polling  # a window already running ends at the next round


@pytest.mark.asyncio
async def test_reloaded_warm_step_interval_governs_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``performance.warm_step_interval_us`` applies on reload: 0 stops the warm steps, a new interval starts them."""
    window = "\nwarm_window_ms = 3600000"
    with reloadable_service(tmp_path, monkeypatch, "warm_step_interval_us = 1000" + window) as (state, reload):
        eng = state.engine
        await eng.submit(Tick(100.0, 1.0, 1_700_000_000_000, "A"))
        await asyncio.sleep(0.02)
        assert eng.stats.warm_steps > 0
        reload("warm_step_interval_us = 0" + window)
        assert state.cfg.performance.warm_step_interval_us == 0
        await asyncio.sleep(0.01)  # a round already scheduled ends the timer
        stopped = eng.stats.warm_steps
        await asyncio.sleep(0.02)
        assert eng.stats.warm_steps == stopped and eng._warm_handle is None
        reload("warm_step_interval_us = 2000" + window)
        await eng.submit(Tick(100.0, 1.0, 1_700_000_000_001, "A"))
        await asyncio.sleep(0.02)
        assert eng.stats.warm_steps > stopped
        await eng.drain(save=False)


def test_sighup_while_starting_is_logged_and_ignored() -> None:
    """Before the app installs its reload handler, SIGHUP's default action ended the process without a word."""
    code = ("import os, signal, logging, sys\n"
            "logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='%(levelname)s %(message)s')\n"
            "from cerebellar_norse.api.lifecycle import ignore_sighup_while_starting\n"
            "ignore_sighup_while_starting()\n"
            "os.kill(os.getpid(), signal.SIGHUP)\n"
            "print('still here')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "reload requested while the service is starting: ignored" in r.stdout and "still here" in r.stdout


def test_reload_keeps_the_port_given_on_the_command_line(tmp_path: Path) -> None:
    """--port wins over the file at start; a reload of an unchanged file must not call server.port changed."""
    port = _free_port()
    cfg = tmp_path / "service.toml"
    cfg.write_text(BASE.format(port=_free_port()))
    with _service(tmp_path, cfg, port, "--port", str(port)) as proc:
        cfg.write_text(BASE.format(port=_free_port()).replace("queue_size = 4096", "queue_size = 1000"))
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()["queue_capacity"] != 1000:
            time.sleep(0.1)
        out, lines = _stop(proc)
    reloaded = [x for x in lines if x["message"] == "config reloaded"]
    assert reloaded and reloaded[0]["fields"] == {"applied": ["performance.queue_size"], "need_restart": [], "overridden": []}, out
    assert not any("need a restart" in x["message"] for x in lines), out


LOGGING_TOML = """
[paths]
state_dir = "{state_dir}"
[training]
bootstrap_on_first_run = false
[performance]
max_batch_delay_us = {delay}
[logging]
level = "{level}"
"""


@contextlib.contextmanager
def logged_reloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: str,
                   **env: str) -> Iterator[tuple[ServiceState, Callable[..., list[dict[str, Any]]]]]:
    """A service whose JSON log lines go to a buffer, and a function that rewrites its config file, reloads, and
    returns the lines the reload wrote."""
    import io

    from cerebellar_norse.observability.logging import setup_logging

    for k in [k for k in os.environ if k.startswith("CEREBELLAR_NORSE_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg_path = tmp_path / "service.toml"

    def write(level: str, delay: int) -> None:
        cfg_path.write_text(LOGGING_TOML.format(state_dir=tmp_path / "state", level=level, delay=delay))

    write(level, 200)
    root = logging.getLogger()
    root_level, root_handlers = root.level, list(root.handlers)
    buf = io.StringIO()
    cfg = load_checked_config(cfg_path)
    setup_logging(cfg.logging, stream=buf)
    state = build_service(cfg)

    def reload(level: str, delay: int = 200) -> list[dict[str, Any]]:
        write(level, delay)
        start = len(buf.getvalue())
        reload_config(state, str(cfg_path))
        return [json.loads(x) for x in buf.getvalue()[start:].splitlines() if x.strip()]

    try:
        yield state, reload
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in root_handlers:
            root.addHandler(h)
        root.setLevel(root_level)


def test_a_reload_is_logged_whatever_the_level(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload that raises logging.level to WARNING (or one made at ERROR) still leaves its line in the journal."""
    with logged_reloads(tmp_path, monkeypatch, "INFO") as (state, reload):
        lines = reload("WARNING")
        assert logging.getLogger().level == logging.WARNING
        (line,) = [x for x in lines if x["message"] == "config reloaded"]
        assert line["level"] == "INFO" and line["fields"]["applied"] == ["logging.level"]
        lines = reload("ERROR", delay=300)  # at ERROR: the INFO outcome and the WARNING about a restart key still show
        (line,) = [x for x in lines if x["message"] == "config reloaded"]
        assert line["fields"]["applied"] == ["logging.level", "performance.max_batch_delay_us"]
        lines = reload("ERROR", delay=300)  # nothing changed: still said
        assert [x["fields"] for x in lines if x["message"] == "config reloaded"] == [
            {"applied": [], "need_restart": [], "overridden": []}]
        assert [x["message"] for x in lines] == ["config reloaded"]  # the level still filters every other line
        assert state.cfg.logging.level == "ERROR" and logging.getLogger().level == logging.ERROR


def test_a_reload_of_logging_level_overridden_by_the_environment_says_so(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With CEREBELLAR_NORSE_LOG set, a changed logging.level does not apply: the reload must not call it applied."""
    with logged_reloads(tmp_path, monkeypatch, "INFO", CEREBELLAR_NORSE_LOG="info") as (_, reload):
        lines = reload("ERROR", delay=300)
        assert logging.getLogger().level == logging.INFO  # the environment still wins
        (line,) = [x for x in lines if x["message"] == "config reloaded"]
        assert line["fields"]["applied"] == ["performance.max_batch_delay_us"]
        assert line["fields"]["overridden"] == ["logging.level"]
        (warn,) = [x for x in lines if x["level"] == "WARNING"]
        assert "CEREBELLAR_NORSE_LOG=INFO overrides it" in warn["message"] and "ERROR" in warn["message"]
    with logged_reloads(tmp_path, monkeypatch, "INFO", CEREBELLAR_NORSE_LOG="bogus") as (_, reload):
        lines = reload("WARNING")  # an invalid variable is ignored: the file's level applies
        assert logging.getLogger().level == logging.WARNING
        (line,) = [x for x in lines if x["message"] == "config reloaded"]
        assert line["fields"]["applied"] == ["logging.level"] and line["fields"]["overridden"] == []


def test_the_status_line_names_the_served_model_after_a_reload_and_a_swap(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``systemctl status`` read ``serving`` after any reload (model and device gone), ``reload refused: …`` for good
    after a refused one, and the model of the start after a model swap."""
    from cerebellar_norse.api.modelswap import activate_version

    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)

    def statuses() -> list[str]:
        out = []
        sock.setblocking(False)
        try:
            while True:
                out += [x[len("STATUS="):] for x in sock.recv(4096).decode().split("\n") if x.startswith("STATUS=")]
        except BlockingIOError:
            pass
        return out

    with logged_reloads(tmp_path, monkeypatch, "INFO", NOTIFY_SOCKET=path) as (state, reload):
        # the untrained network is served: degraded, and the status line says so until a model is activated
        served = f"serving model {state.engine.model_version} on {state.device}, degraded (GET /health says why)"
        reload("WARNING")
        assert statuses() == [served]
        (tmp_path / "service.toml").write_text("[server\n")
        reload_config(state, str(tmp_path / "service.toml"))
        assert statuses() == [f"{served} (last reload refused: config invalid)"]
        cfg = state.cfg
        store = ModelStore(tmp_path / "state")
        store.save(generate_weights(cfg), cfg, {"validation": {"loss": 1.0}}, version=TRAINED)
        activate_version(state, store, TRAINED)
        assert statuses() == [f"serving model {TRAINED} on {state.device}"]
    sock.close()


@pytest.mark.parametrize("active", [None, b"20990101T000000Z-ffffff\n", b"\xff\xfe not a version"])
def test_a_refused_swap_leaves_models_active_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           active: bytes | None) -> None:
    """A swap refused after ACTIVE was written (its checkpoint failed on a full disk) puts ACTIVE back as it was:
    absent stays absent, and a file naming an unknown model or no version at all keeps its bytes (it is what
    /health's degraded reason is about), rather than being removed."""
    from cerebellar_norse.api.modelswap import activate_version
    from cerebellar_norse.errors import StorageError

    with logged_reloads(tmp_path, monkeypatch, "INFO") as (state, _reload):
        store = ModelStore(tmp_path / "state")
        store.save(generate_weights(state.cfg), state.cfg, {"validation": {"loss": 1.0}}, version=TRAINED)
        path = store.root / "ACTIVE"
        if active is not None:
            path.write_bytes(active)

        def full(*_a: object, **_k: object) -> None:
            raise StorageError("cannot write checkpoint x: No space left on device (errno 28 ENOSPC)", "x", 28)

        monkeypatch.setattr(state.engine, "set_weights", full)
        with pytest.raises(StorageError):
            activate_version(state, store, TRAINED)
        assert (path.read_bytes() if path.exists() else None) == active


@pytest.mark.asyncio
async def test_a_reload_that_switches_recording_off_closes_the_file_at_once(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/operations.md: a recording is closed (and checksummed) when recording is switched off. It stayed open, with
    no .sha256, until the next batch, which an idle service never gets."""
    rec = tmp_path / "state" / "recordings"

    async def until(cond: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + 10
        while not cond() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return cond()

    with reloadable_service(tmp_path, monkeypatch, "queue_size = 4096\n[debug]\nrecord_requests = true") as (state, reload):
        eng = state.engine
        await eng.submit(Tick(100.0, 1.0, 1_700_000_000_000, "A"))
        assert await until(lambda: bool(list(rec.glob("*.csv"))))
        assert not list(rec.glob("*.sha256"))
        reload("queue_size = 4096\n[debug]\nrecord_requests = false")
        assert state.cfg.debug.record_requests is False
        # every file of the recording (the .csv; a .states only when a market started from a held state) checksummed
        assert await until(lambda: {p.name + ".sha256" for p in rec.glob("ticks-*") if p.suffix != ".sha256"}
                           == {p.name for p in rec.glob("*.sha256")})
        assert list(rec.glob("*.csv.sha256"))
        await eng.drain(save=False)


def test_a_reload_whose_live_keys_do_not_fit_the_running_restart_keys_is_refused_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """queue_size 100 with batch_size 64 is a consistent file, but batch_size takes a restart: applying queue_size
    alone left queue 100 with batch 256 running, which ``--validate-config`` refuses. The checks hold for the mix."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    with reloadable_service(tmp_path, monkeypatch, "queue_size = 4096\nbusy_poll_us = 0") as (state, reload):
        before = state.cfg
        monkeypatch.setenv("NOTIFY_SOCKET", path)  # reloadable_service clears the CEREBELLAR_NORSE_ variables only
        with caplog.at_level(logging.INFO, logger="cerebellar_norse.lifecycle"):
            reload("queue_size = 100\nbatch_size = 64\nbusy_poll_us = 2000")
        assert state.cfg is before and state.engine.snapshot().queue_capacity == 4096
        (refused,) = [r for r in caplog.records if r.getMessage().startswith("config reload refused")]
        text = refused.getMessage()
        assert refused.levelno == logging.ERROR
        assert "performance.queue_size" in text and "performance.batch_size: 256 exceeds queue_size 100" in text
        assert not any(r.getMessage() == "config reloaded" for r in caplog.records)
        sent = []
        with contextlib.suppress(BlockingIOError):
            while True:
                sent += sock.recv(4096).decode().split("\n")
        (status,) = [x for x in sent if x.startswith("STATUS=")]
        assert status.endswith("(last reload refused: config inconsistent with the running one)"), status
        caplog.clear()
        reload("queue_size = 300\nbatch_size = 64")  # 256 fits in 300: applied, batch_size reported for a restart
        assert state.cfg.performance.queue_size == 300 and state.cfg.performance.batch_size == 256
        assert state.engine.snapshot().queue_capacity == 300
    sock.close()


def test_a_reload_of_a_key_an_environment_variable_overrides_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key the file changes while a CEREBELLAR_NORSE_<SECTION>__<KEY> variable sets it keeps the variable's value
    (it wins, as at start); the reload said nothing of it (applied, need_restart and overridden all empty)."""
    var = "CEREBELLAR_NORSE_PERFORMANCE__MAX_BATCH_DELAY_US"
    with logged_reloads(tmp_path, monkeypatch, "INFO", **{var: "500"}) as (state, reload):
        assert state.engine.delay_s == 0.0005
        lines = reload("INFO", delay=300)
        assert state.cfg.performance.max_batch_delay_us == 500 and state.engine.delay_s == 0.0005
        (line,) = [x for x in lines if x["message"] == "config reloaded"]
        assert line["fields"] == {"applied": [], "need_restart": [], "overridden": ["performance.max_batch_delay_us"]}
        (warn,) = [x for x in lines if x["level"] == "WARNING"]
        assert f"performance.max_batch_delay_us ({var})" in warn["message"]
        assert warn["fields"] == {"overridden_by": {"performance.max_batch_delay_us": var}}
        lines = reload("WARNING", delay=500)  # the file agrees with the variable: nothing overridden
        (line,) = [x for x in lines if x["message"] == "config reloaded"]
        assert line["fields"] == {"applied": ["logging.level"], "need_restart": [], "overridden": []}


def saved_again_after_first_read(monkeypatch: pytest.MonkeyPatch, path: Path, text: str) -> list[bytes]:
    """Make the file at ``path`` be saved again with ``text`` right after its first read (an editor or a
    config-management run in between); returns the list of its reads (``Path.read_bytes``), filled as they happen."""
    reads: list[bytes] = []
    read_bytes = Path.read_bytes

    def read_then_saved_again(self: Path) -> bytes:
        data = read_bytes(self)
        if self == path:
            reads.append(data)
            if len(reads) == 1:
                self.write_text(text)
        return data

    monkeypatch.setattr(Path, "read_bytes", read_then_saved_again)
    return reads


def test_a_reload_reads_the_file_once_so_a_change_during_it_cannot_mix_two_versions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload read the file twice (to build and check the new config, then again for the keys environment variables
    override): a file saved between the two reads (an editor, a config-management run) gave a report, and the values
    remembered for the next reload's warning, of a file that was neither checked nor applied. It is read once now:
    the file rewritten right after that read changes nothing in this reload."""
    var = "CEREBELLAR_NORSE_PERFORMANCE__MAX_BATCH_DELAY_US"
    with logged_reloads(tmp_path, monkeypatch, "INFO", **{var: "500"}) as (state, reload):
        # saved again at once after the reload's read: the variable's value now, and another level
        reads = saved_again_after_first_read(monkeypatch, tmp_path / "service.toml", LOGGING_TOML.format(
            state_dir=tmp_path / "state", level="ERROR", delay=500))
        lines = reload("WARNING", delay=300)
        assert len(reads) == 1, "the file was read more than once"
        (line,) = [x for x in lines if x["message"] == "config reloaded"]
        assert line["fields"] == {"applied": ["logging.level"], "need_restart": [],
                                  "overridden": ["performance.max_batch_delay_us"]}
        assert state.cfg.logging.level == "WARNING" and state.cfg.performance.max_batch_delay_us == 500
        assert state.file_overridden == {"performance.max_batch_delay_us": 300}


def test_the_start_reads_the_config_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start read the file to build the config, then the service read it again for the values of the keys
    environment variables override, which the next reload compares with: a file saved in between left values the
    service never started with, and that reload warned (or stayed silent) about a change that was not one. The real
    start, in this process, up to where uvicorn would serve."""
    from cerebellar_norse import cli
    from cerebellar_norse.api import server as server_mod

    for k in [k for k in os.environ if k.startswith("CEREBELLAR_NORSE_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("CEREBELLAR_NORSE_PERFORMANCE__MAX_BATCH_DELAY_US", "500")
    cfg_path = tmp_path / "service.toml"
    cfg_path.write_text(LOGGING_TOML.format(state_dir=tmp_path / "state", level="INFO", delay=300))
    remembered: list[dict[str, Any]] = []

    def run(self: Any, sockets: Any = None) -> None:  # where uvicorn would serve: what the service remembers
        remembered.append(dict(self.service.file_overridden))

    reads = saved_again_after_first_read(monkeypatch, cfg_path, LOGGING_TOML.format(
        state_dir=tmp_path / "state", level="INFO", delay=400))
    monkeypatch.setattr(server_mod.GracefulServer, "run", run)
    root = logging.getLogger()
    root_level, root_handlers = root.level, list(root.handlers)
    hup = signal.getsignal(signal.SIGHUP)
    try:
        cli.main(["--config", str(cfg_path), "--port", str(_free_port())])
    finally:
        signal.signal(signal.SIGHUP, hup)
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in root_handlers:
            root.addHandler(h)
        root.setLevel(root_level)
    assert remembered == [{"performance.max_batch_delay_us": 300}]
    assert len(reads) == 1, "the file was read more than once"


def test_reloaded_cpu_wakeup_latency_is_held_changed_and_released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``performance.cpu_wakeup_latency_us`` applies on reload (on a stand-in for the kernel's device), and the
    metric says whether the limit is held."""
    from cerebellar_norse.wakeup import WakeupLatency

    dev = tmp_path / "cpu_dma_latency"
    dev.write_bytes(b"")

    def gauge(name: str) -> str:
        return next(ln for ln in state.metrics.render().decode().splitlines() if ln.startswith(f"{name} "))

    def held() -> str:
        return gauge("cerebellar_norse_cpu_wakeup_limit_held")

    def refused() -> str:
        return gauge("cerebellar_norse_cpu_wakeup_limit_refused")

    with reloadable_service(tmp_path, monkeypatch, "queue_size = 4096") as (state, reload):
        state.wakeup = WakeupLatency(dev)
        assert held().endswith(" 0.0") and refused().endswith(" 0.0")
        reload("cpu_wakeup_latency_us = 0")
        assert state.wakeup.limit_us == 0 and dev.read_bytes() == (0).to_bytes(4, sys.byteorder, signed=True)
        assert held().endswith(" 1.0")
        reload("cpu_wakeup_latency_us = 40")
        assert state.wakeup.limit_us == 40 and dev.read_bytes()[4:] == (40).to_bytes(4, sys.byteorder, signed=True)
        reload("queue_size = 4096")
        assert not state.wakeup.held and held().endswith(" 0.0")
        state.wakeup.device = tmp_path / "gone" / "cpu_dma_latency"
        reload("cpu_wakeup_latency_us = 0")
        assert not state.wakeup.held and "gone" in state.wakeup.refusal and held().endswith(" 0.0")
        assert refused().endswith(" 1.0")  # set and refused: told apart from not set
        state.wakeup.device = dev
        reload("cpu_wakeup_latency_us = 5")
        assert held().endswith(" 1.0") and refused().endswith(" 0.0")
        reload("queue_size = 4096")
        assert held().endswith(" 0.0") and refused().endswith(" 0.0")


def _real_wakeup_device() -> bool:
    from cerebellar_norse.wakeup import DEVICE

    return DEVICE.exists() and os.access(DEVICE, os.R_OK | os.W_OK)


@pytest.mark.skipif(not _real_wakeup_device(), reason="the kernel's CPU latency QoS device is not readable and writable here")
def test_the_service_holds_its_wakeup_limit_on_the_host_and_a_crash_leaves_none(tmp_path: Path) -> None:
    """Held from the start, released and held again by reloads; kill -9 leaves the host's limit as it was."""
    before = host_limit_us()
    assert before is not None
    if before <= 300:
        pytest.skip(f"another process holds a lower limit ({before} us)")
    port = _free_port()
    cfg = tmp_path / "service.toml"
    plain = BASE.format(port=port)
    cfg.write_text(plain.replace("queue_size = 4096", "queue_size = 4096\ncpu_wakeup_latency_us = 300"))

    def until(limit: int) -> None:
        deadline = time.monotonic() + 20
        while host_limit_us() != limit:
            assert time.monotonic() < deadline, f"host limit {host_limit_us()} us, expected {limit}"
            time.sleep(0.05)

    with _service(tmp_path, cfg, port) as proc:
        assert host_limit_us() == 300
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "cerebellar_norse_cpu_wakeup_limit_held 1.0" in metrics
        cfg.write_text(plain)
        proc.send_signal(signal.SIGHUP)
        until(before)
        cfg.write_text(plain.replace("queue_size = 4096", "queue_size = 4096\ncpu_wakeup_latency_us = 250"))
        proc.send_signal(signal.SIGHUP)
        until(250)
        proc.kill()
        proc.wait()
    assert host_limit_us() == before
