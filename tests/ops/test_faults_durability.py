"""Fault injection against real service processes: durability, loud failures, fallbacks that keep data.

Every test starts ``python -m cerebellar_norse.cli`` on a free loopback port with its
own state dir (the API tests' launcher, ``tests/api/live_helpers.py``) and then
breaks something the way an operator's incident would:

* kill -9 under load: the restarted service's state of every market equals, bit for
  bit, that of a twin service that never crashed and was fed the same ticks, and
  includes every acknowledged tick;
* a state dir that is read-only, full or not a directory at start: exit code 1 and one
  line on stderr naming the path and errno, no traceback;
* a disk that fills up while serving: ticks are refused (503 ``capacity``, ``Retry-After``)
  until space returns, then served again without a restart; a save at shutdown that fails
  exits non-zero with path and errno in the log; the previous file is kept, and no
  acknowledged tick is lost;
* corrupt state and journal files: moved aside (quarantined), never overwritten;
* a corrupt active model: the newest valid one is served, /health says "degraded"
  with the reason, and no bootstrap model is trained;
* kill -9 during a training job: the job process dies with the service and writes no
  model; its record says so at the next start.

Read-only and full disks are small tmpfs mounts; where the test cannot mount one (not
root, no CAP_SYS_ADMIN) those cases are skipped, the others still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import BASE_TS, REPO_ROOT, LiveServer, free_port, launch, mount_tmpfs, server_environ, start, unmount

from cerebellar_norse.config import load_config
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.journal import Durability
from cerebellar_norse.engine.persistence import STATE_FILE
from cerebellar_norse.engine.segments import JOURNAL_DIR
from cerebellar_norse.engine.state_dir import StateDirLock
from cerebellar_norse.neurons.encoder import S_N_TICKS
from cerebellar_norse.neurons.state import STATE_FIELDS
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.storage import read_checksummed
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training.checkpoints import ModelStore
from cerebellar_norse.training.data import write_csv
from cerebellar_norse.training.jobs import JobManager

TOKEN = "fault-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


# -- helpers -------------------------------------------------------------------------------


def saved_states(state_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every market's saved state in ``market_state.bin``: {market: {field: array}}."""
    with np.load(io.BytesIO(read_checksummed(state_dir / STATE_FILE)), allow_pickle=False) as z:
        markets = [str(m) for m in z["markets"]]
        return {m: {f: np.array(z[f][j]) for f in STATE_FIELDS} for j, m in enumerate(markets)}


def ticks_applied(st: Mapping[str, np.ndarray]) -> int:
    return int(st["enc"][S_N_TICKS])


def assert_bitwise_equal(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], market: str) -> None:
    for f in STATE_FIELDS:
        assert a[f].dtype == b[f].dtype and a[f].shape == b[f].shape, (market, f)
        assert a[f].tobytes() == b[f].tobytes(), f"{market}: state field {f} differs"


def tick_of(market: str, k: int) -> dict[str, Any]:
    """The k-th tick of a market: 250 ms apart, a deterministic wandering price."""
    return {"price": 100.0 + 0.37 * ((k * 13) % 11) - 0.05 * (k % 7), "volume": 10.0 + (k * 17) % 90,
            "timestamp": BASE_TS + 250 * k, "market_id": market}


def start_together(specs: list[tuple[Path, Path, Mapping[str, str]]]) -> list[LiveServer]:
    """Start several servers at once (startup time paid once); each healthy or the test fails with its log."""
    servers = []
    for state_dir, log_path, env in specs:
        port = free_port()
        servers.append(LiveServer(launch(state_dir, log_path, port, env), port, state_dir, log_path))
    deadline = time.monotonic() + 90
    pending = list(servers)
    while pending and time.monotonic() < deadline:
        for srv in list(pending):
            if srv.proc.poll() is not None:
                raise AssertionError(f"server exited with {srv.proc.returncode} during startup\n{srv.log()[-4000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{srv.url}/health", timeout=1.0).status_code == 200:
                    pending.remove(srv)
        time.sleep(0.05)
    assert not pending, "servers not healthy in time"
    return servers


def kill9(srv: LiveServer) -> None:
    srv.proc.send_signal(signal.SIGKILL)
    srv.returncode = srv.proc.wait(timeout=10)
    assert srv.returncode == -signal.SIGKILL


@pytest.fixture
def servers() -> Iterator[list[LiveServer]]:
    """Servers a test started; killed at the end if still running."""
    started: list[LiveServer] = []
    yield started
    for srv in started:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()


Mount = Callable[..., Path]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Mount]:
    """``tmpfs("8m")``: a fresh tmpfs mounted under tmp_path; the test is skipped where mounting is not allowed."""
    mounted: list[Path] = []

    def mount(size: str, ro: bool = False) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        why = mount_tmpfs(point, size, ro)
        if why is not None:
            pytest.skip(why)
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        unmount(point)


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until the file system is full; returns it."""
    path = directory / "filler"
    block = b"\xa5" * 4096
    with open(path, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    with contextlib.suppress(OSError), open(path, "ab", buffering=0) as fh:  # the last partial block
        while True:
            fh.write(b"\xa5")
    return path


def one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a refused start (exit code 1, no traceback)."""
    assert res.returncode == 1, (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
    assert "Traceback" not in res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Started server process" not in res.stdout + res.stderr  # refused before uvicorn ran
    return lines[0]


# -- kill -9 under load ----------------------------------------------------------------------


async def drive(url: str, markets: list[str], acked: dict[str, int], inflight: dict[str, int], stop: asyncio.Event,
                batch_markets: set[str]) -> None:
    """One sequential client per market (each awaits its answer before sending the next) until the server dies or ``stop``."""
    async with httpx.AsyncClient(base_url=url, timeout=10.0, limits=httpx.Limits(max_connections=len(markets))) as c:

        async def client(m: str) -> None:
            k = 0
            while not stop.is_set():
                try:
                    if m in batch_markets:  # three ticks per request: all acknowledged together
                        inflight[m] = 3
                        r = await c.post("/neural/process/batch", json={"ticks": [tick_of(m, k + j) for j in range(3)]})
                        n = 3
                    else:
                        inflight[m] = 1
                        r = await c.post("/neural/process", json=tick_of(m, k))
                        n = 1
                except httpx.TransportError:
                    return  # the server is gone: the request in flight was not acknowledged
                assert r.status_code == 200, r.text
                k += n
                acked[m] = k
                inflight[m] = 0

        await asyncio.gather(*(client(m) for m in markets))


def feed_sequential(url: str, market: str, n: int) -> None:
    with httpx.Client(base_url=url, timeout=30.0) as c:
        for k0 in range(0, n, 50):
            ks = range(k0, min(k0 + 50, n))
            r = c.post("/neural/process/batch", json={"ticks": [tick_of(market, k) for k in ks]})
            assert r.status_code == 200, r.text


@pytest.mark.slow
def test_kill9_under_load_loses_no_acknowledged_tick(tmp_path: Path, servers: list[LiveServer]) -> None:
    """Crash mid-load with checkpoints and journal roll-overs going on; compare with a twin that never crashed."""
    crashy, twin_dir = tmp_path / "crashy", tmp_path / "twin"
    fast = {"CEREBELLAR_NORSE_PERFORMANCE__CHECKPOINT_INTERVAL_S": "0.3",
            "CEREBELLAR_NORSE_PERFORMANCE__JOURNAL_SEGMENT_SIZE": "1MB"}
    a, twin = start_together([(crashy, tmp_path / "a.log", fast), (twin_dir, tmp_path / "twin.log", {})])
    servers += [a, twin]
    markets = [f"K{j:02d}" for j in range(12)]
    acked = dict.fromkeys(markets, 0)
    inflight = dict.fromkeys(markets, 0)

    async def load_then_kill() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(drive(a.url, markets, acked, inflight, stop, set(markets[:3])))
        await asyncio.sleep(2.5)  # several checkpoints happen meanwhile
        assert not task.done()
        kill9(a)  # mid-request for most markets
        await asyncio.wait_for(task, timeout=20)

    asyncio.run(load_then_kill())
    assert sum(acked.values()) > 100, acked
    assert "Traceback" not in a.log()

    restarted = start(crashy, tmp_path / "a2.log")
    servers.append(restarted)
    with httpx.Client(base_url=restarted.url, timeout=10) as c:
        assert c.get("/health").json()["pool"]["markets"] == len(markets)
    assert restarted.stop() == 0, restarted.log()[-3000:]
    recovered = saved_states(crashy)
    assert sorted(recovered) == markets

    for m in markets:  # every acknowledged tick is in, and at most the one request in flight beyond it
        n = ticks_applied(recovered[m])
        assert acked[m] <= n <= acked[m] + inflight[m], (m, acked[m], inflight[m], n)
        feed_sequential(twin.url, m, n)
    assert twin.stop() == 0, twin.log()[-3000:]
    twin_states = saved_states(twin_dir)
    for m in markets:
        assert_bitwise_equal(recovered[m], twin_states[m], m)
    assert "market state recovered" in restarted.log()


# -- unwritable state dir at start -------------------------------------------------------------


@dataclass
class Refusal:
    state_dir: Path
    result: subprocess.CompletedProcess[str] | None = None
    skipped: str | None = None


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Refusal]]:
    """Start-ups on unusable state dirs, launched together (each costs an interpreter start): name -> outcome."""
    root = tmp_path_factory.mktemp("refusals")
    (root / "a-file").write_text("not a directory")
    cases = {"under a file": Refusal(root / "a-file" / "state"), "read-only": Refusal(root / "ro"),
             "full": Refusal(root / "full"), "in use": Refusal(root / "in-use"),
             "models a link to nothing": Refusal(root / "models-dangling"), "models a file": Refusal(root / "models-file")}
    cases["models a link to nothing"].state_dir.mkdir()
    (cases["models a link to nothing"].state_dir / "models").symlink_to(root / "not-mounted")  # a shared dir not mounted
    cases["models a file"].state_dir.mkdir()
    (cases["models a file"].state_dir / "models").write_text("not a directory")
    mounted = []
    why = mount_tmpfs(cases["read-only"].state_dir, "64k", ro=True)
    if why is None:
        mounted.append(cases["read-only"].state_dir)
    cases["read-only"].skipped = why
    why = mount_tmpfs(cases["full"].state_dir, "64k")
    if why is None:
        mounted.append(cases["full"].state_dir)
        fill(cases["full"].state_dir)
    cases["full"].skipped = why
    lock = StateDirLock(cases["in use"].state_dir)
    cases["in use"].state_dir.mkdir()
    lock.acquire()  # this process holds the state dir, as a running service would
    try:
        procs = {name: subprocess.Popen([sys.executable, "-m", "cerebellar_norse.cli", "--port", str(free_port())], cwd=REPO_ROOT,
                                        env=server_environ(c.state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for name, c in cases.items() if c.skipped is None}
        for name, proc in procs.items():
            try:
                out, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:  # it served instead of refusing: the test fails, leaving no process
                proc.kill()
                out, err = proc.communicate()
            cases[name].result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        yield cases
    finally:
        lock.release()
        for point in mounted:
            unmount(point)


def refusal_line(refusals: dict[str, Refusal], name: str) -> tuple[Path, str]:
    case = refusals[name]
    if case.skipped is not None:
        pytest.skip(case.skipped)
    assert case.result is not None
    return case.state_dir, one_line_error(case.result)


def test_state_dir_under_a_file_fails_start_up_with_one_line(refusals: dict[str, Refusal]) -> None:
    state, line = refusal_line(refusals, "under a file")
    assert line == f"cerebellar-norse: state dir is not writable: {state}: Not a directory (errno 20 ENOTDIR)"


def test_read_only_state_dir_fails_start_up_with_one_line(refusals: dict[str, Refusal]) -> None:
    state, line = refusal_line(refusals, "read-only")
    assert line == f"cerebellar-norse: state dir is not writable: {state}: Read-only file system (errno 30 EROFS)"


def test_full_state_dir_fails_start_up_with_one_line(refusals: dict[str, Refusal]) -> None:
    state, line = refusal_line(refusals, "full")
    assert line == f"cerebellar-norse: state dir is not writable: {state}: No space left on device (errno 28 ENOSPC)"


def test_state_dir_in_use_fails_start_up_with_one_line(refusals: dict[str, Refusal]) -> None:
    """A second service on a state dir another process holds is refused before it touches models or jobs."""
    state, line = refusal_line(refusals, "in use")
    assert line == (f"cerebellar-norse: state dir {state} is in use by another cerebellar-norse process "
                    f"(pid {os.getpid()}); one service per state dir")
    assert sorted(p.name for p in state.iterdir()) == [".lock"]


@pytest.mark.parametrize(("name", "what"), [
    ("models a link to nothing", "a dangling symbolic link: its target '{root}/not-mounted' does not exist"),
    ("models a file", "not a directory")])
def test_a_models_dir_that_is_no_directory_fails_start_up_with_one_line_and_verify_data_says_so(
        refusals: dict[str, Refusal], name: str, what: str) -> None:
    """Not served without its models: no untrained network, no market state moved aside, nothing written."""
    state, line = refusal_line(refusals, name)
    problem = (f"{state / 'models'}: {what.format(root=state.parent)}: the stored models cannot be read (the service "
               "does not start on it, rather than serve without them and move aside the market states saved with "
               "them); restore it (mount or create its target), or remove it to start without models")
    assert line == f"cerebellar-norse: {problem}"
    assert sorted(p.name for p in state.iterdir()) == ["models"]  # not even the lock: refused before anything
    verify = subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", "--verify-data", str(state)], cwd=REPO_ROOT,
                            env=server_environ(state), capture_output=True, text=True, timeout=60)
    assert verify.returncode == 1 and f"cerebellar-norse: {problem}" in verify.stderr.splitlines(), verify.stderr


# -- a disk that fills up while serving ---------------------------------------------------------


def recovered_tick_counts(state_dir: Path, env: Mapping[str, str]) -> dict[str, int]:
    """What the next start restores: the service's own recovery (checkpoint + journal replay), run here."""
    cfg = load_config(None, environ={**{k: v for k, v in server_environ(state_dir, env).items()
                                         if k.startswith("CEREBELLAR_NORSE_")}})
    engine = Engine(cfg)
    durability = Durability(engine)
    durability.recover()
    try:
        return {m: int(engine.arrays.enc[s, S_N_TICKS]) for m, s in engine.pool.table.items()}
    finally:
        durability.close(save=False)


def send_ticks(url: str, markets: list[str], start_k: int, n: int) -> None:
    with httpx.Client(base_url=url, timeout=10) as c:
        for k in range(start_k, start_k + n):
            for m in markets:
                r = c.post("/neural/process", json=tick_of(m, k))
                assert r.status_code == 200, r.text


def test_failed_save_at_shutdown_exits_nonzero_keeps_the_previous_file_and_every_tick(tmp_path: Path, tmpfs: Mount,
                                                                                      servers: list[LiveServer]) -> None:
    state = tmpfs("8m") / "state"
    env = {"CEREBELLAR_NORSE_PERFORMANCE__JOURNAL_SEGMENT_SIZE": "1MB"}
    srv = start(state, tmp_path / "a.log", env)
    servers.append(srv)
    send_ticks(srv.url, ["F1", "F2"], 0, 20)
    previous = (state / STATE_FILE).read_bytes()  # the start-up checkpoint
    filler = fill(state.parent)
    send_ticks(srv.url, ["F1", "F2"], 20, 5)  # still acknowledged: the journal's space was reserved
    rc = srv.stop()
    log = srv.log()
    assert rc == 1, log[-3000:]
    assert f"cannot save market state {state / STATE_FILE}: No space left on device (errno 28 ENOSPC)" in log
    assert "Traceback" not in log
    assert (state / STATE_FILE).read_bytes() == previous
    assert not [p for p in state.iterdir() if p.name.endswith(".tmp")]
    filler.unlink()
    assert recovered_tick_counts(state, env) == {"F1": 25, "F2": 25}  # every acknowledged tick


def saved_tick_counts(state_dir: Path) -> dict[str, int]:
    """Ticks applied to each market, as saved in ``market_state.bin`` (by a clean stop)."""
    with np.load(io.BytesIO(read_checksummed(state_dir / STATE_FILE)), allow_pickle=False) as z:
        return {str(m): int(z["enc"][j][S_N_TICKS]) for j, m in enumerate(z["markets"])}


def test_disk_full_while_serving_refuses_ticks_until_space_returns_without_losing_any(
        tmp_path: Path, tmpfs: Mount, servers: list[LiveServer]) -> None:
    """The disk fills up while ticks flow: the journal's next file cannot be created, so ticks are refused (503
    capacity, Retry-After) before they change anything, /health, /metrics and the ``systemctl status`` line say why,
    one WARNING; once the filler is deleted the next tick is served without a restart, and every acknowledged tick is
    in the saved state."""
    state = tmpfs("12m") / "state"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # systemd's end of sd_notify
    notify_name = f"cerebellar-norse-test-{os.getpid()}-{time.monotonic_ns()}"
    notify.bind("\0" + notify_name)
    env = {"CEREBELLAR_NORSE_PERFORMANCE__JOURNAL_SEGMENT_SIZE": "1MB",
           "CEREBELLAR_NORSE_PERFORMANCE__CHECKPOINT_INTERVAL_S": "0.5",  # periodic checkpoints meet the full disk too
           "NOTIFY_SOCKET": "@" + notify_name}
    srv = start(state, tmp_path / "a.log", env)
    servers.append(srv)

    def status_line(refusing: bool) -> str:
        """The next STATUS= sent that does (or does not) say ticks are refused."""
        notify.settimeout(10)
        while True:
            for line in notify.recv(4096).decode().splitlines():
                if line.startswith("STATUS=serving model") and ("refusing ticks" in line) == refusing:
                    return line
    acked: dict[str, int] = {}
    k = 0

    def batch(c: httpx.Client, n: int) -> httpx.Response:
        nonlocal k
        ticks = [tick_of(f"D{j % 4}", k + j) for j in range(n)]
        r = c.post("/neural/process/batch", json={"ticks": ticks})
        if r.status_code == 200:
            for t in ticks:
                acked[str(t["market_id"])] = acked.get(str(t["market_id"]), 0) + 1
            k += n
        return r

    with httpx.Client(base_url=srv.url, timeout=10) as c:
        assert batch(c, 40).status_code == 200
        filler = fill(state.parent)
        refused: list[httpx.Response] = []
        while len(refused) < 3:  # until the open journal file is full (its blocks were reserved: it fills up)
            assert k < 400 * 250, "the journal file never filled up"
            r = batch(c, 250)
            if r.status_code != 200:
                refused.append(r)
        for r in refused:
            assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
            err = r.json()["error"]
            assert err["type"] == "capacity" and "No space left on device (errno 28 ENOSPC)" in err["message"], err
        health = c.get("/health")
        reason = health.json()["reason"]
        assert health.status_code == 503 and reason.startswith(
            "journal waiting for disk space (no space left on device): cannot create journal file"), health.text
        assert f"free space on the file system of the state dir {state}" in reason
        metrics = c.get("/metrics").text
        assert "cerebellar_norse_journal_waiting 1.0" in metrics and "cerebellar_norse_ready 0.0" in metrics
        assert "cerebellar_norse_journal_waits_total 1.0" in metrics
        assert status_line(refusing=True).endswith(
            ", refusing ticks: the journal waits for disk space (no space left on device) (GET /health says why)")
        assert srv.proc.poll() is None
        filler.unlink()  # space is back: the next tick that tries the file (at most every 0.25 s) creates it
        for _ in range(20):
            r = batch(c, 8)
            if r.status_code == 200:
                break
            assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
            time.sleep(0.3)
        assert r.status_code == 200, r.text
        assert c.get("/health").status_code == 200
        assert "cerebellar_norse_journal_waiting 0.0" in c.get("/metrics").text
        assert "refusing" not in status_line(refusing=False)
    notify.close()
    assert srv.stop() == 0, srv.log()[-3000:]
    log = srv.log()
    assert "Traceback" not in log and '"ERROR"' not in log, log[-3000:]
    warnings = [line for line in log.splitlines() if '"WARNING"' in line and "ENOSPC" in line]
    waits = [line for line in warnings if "is full: ticks, market resets" in line]
    skips = [line for line in warnings if "checkpoint skipped" in line]
    assert len(waits) == 1 and len(skips) <= 1 and len(warnings) == len(waits) + len(skips), warnings
    assert f"waiting for disk space (no space left on device): free space on the file system of the state dir {state}" \
        in waits[0]
    assert "ticks are accepted again" in log
    assert saved_tick_counts(state) == acked  # every acknowledged tick, none of the refused ones
    verify = subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", "--verify-data", str(state)],
                            cwd=REPO_ROOT, env=server_environ(state), capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr


# -- corrupt files are moved aside --------------------------------------------------------------


def test_corrupt_state_and_journal_files_are_quarantined_not_overwritten(tmp_path: Path, servers: list[LiveServer]) -> None:
    state = tmp_path / "state"
    (state / JOURNAL_DIR).mkdir(parents=True)
    garbage = b"CNSUM1 this is not a checksummed state file" * 10
    (state / STATE_FILE).write_bytes(garbage)
    bad_journal = b"\x00garbage journal\x00" * 300
    (state / JOURNAL_DIR / "00000000000000000007.journal").write_bytes(bad_journal)
    srv = start(state, tmp_path / "a.log")
    servers.append(srv)
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        assert c.get("/health").json()["pool"]["markets"] == 0
        assert c.post("/neural/process", json=tick_of("Q1", 0)).status_code == 200
    assert srv.stop() == 0, srv.log()[-3000:]
    (moved,) = state.glob(f"{STATE_FILE}.corrupt-*")
    assert moved.read_bytes() == garbage  # kept as found
    (jmoved,) = (state / JOURNAL_DIR).glob("00000000000000000007.journal.corrupt-*")
    assert jmoved.read_bytes() == bad_journal
    assert list(saved_states(state)) == ["Q1"]  # the new state went to a new file
    log = srv.log()
    assert "market state not restored" in log and str(moved) in log and str(jmoved) in log
    assert "Traceback" not in log


# -- a corrupt active model ------------------------------------------------------------------------


def test_corrupt_active_model_serves_the_newest_valid_one_degraded(tmp_path: Path, servers: list[LiveServer]) -> None:
    state = tmp_path / "state"
    cfg = load_config(None, environ={})
    store = ModelStore(state)
    w = generate_weights(cfg)
    old, newer, active = "20240101T000000Z-aaaaaa", "20240102T000000Z-bbbbbb", "20240103T000000Z-cccccc"
    for v in (old, newer, active):
        store.save(w, cfg, {"validation": {"loss": 1.0}}, version=v)
    npz = store.root / active / "weights.npz"
    raw = bytearray(npz.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    npz.write_bytes(bytes(raw))
    store.set_active(active)
    bad_newer = store.root / newer / "metrics.json"
    bad_newer.write_text("{}")  # also corrupt (checksum): the newest *valid* one is the oldest
    srv = start(state, tmp_path / "a.log", {"CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN": "true"})
    servers.append(srv)
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        r = c.get("/health")
        assert r.status_code == 200
        body = r.json()
        assert body["status"] == "degraded" and body["model_version"] == old, body
        assert f"active model {active} is corrupt" in body["reason"] and "weights.npz" in body["reason"]
        assert f"serving model {old} instead" in body["reason"]
        assert c.post("/neural/process", json=tick_of("D1", 0)).json()["model_version"] == old
    assert srv.stop() == 0
    assert store.versions() == [old, newer, active]  # no bootstrap model: a valid one existed
    assert store.active_version() == active  # ACTIVE is left for the operator
    assert npz.read_bytes() == bytes(raw)  # the corrupt model is kept as found
    assert "training the default model" not in srv.log()


# -- training jobs die with the service -------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """Pids of every live descendant of ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (p / "stat").read_text()
                parents[int(p.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [], [pid]
    while frontier:
        cur = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == cur]
        out += kids
        frontier += kids
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
def test_training_job_dies_with_a_killed_service_and_writes_no_model(tmp_path: Path, servers: list[LiveServer]) -> None:
    state, data = tmp_path / "state", tmp_path / "data"
    write_csv(data / "small.csv", generate_ticks(6000, 2, seed=1))
    env = {"CEREBELLAR_NORSE_PATHS__DATA_DIR": str(data), "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN}
    srv = start(state, tmp_path / "a.log", env)
    servers.append(srv)
    with httpx.Client(base_url=srv.url, timeout=30, headers=AUTH) as c:
        r = c.post("/training", json={"files": ["small.csv"], "epochs": 1000, "activate": "never"})
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the job process is training (it imports torch first)
            st = c.get(f"/training/status/{job_id}").json()
            if st["state"] != "running" or st["progress"] > 0:
                break
            time.sleep(0.2)
        assert st["state"] == "running" and st["progress"] > 0, st
    kids = children_of(srv.proc.pid)
    assert kids, "no job process found"
    kill9(srv)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(k) for k in kids):
        time.sleep(0.05)
    assert not [k for k in kids if alive(k)], "job processes outlived the service"
    time.sleep(2.0)  # nothing of the job may still write
    models = state / "models"
    assert not models.exists() or list(models.iterdir()) == [], list(models.iterdir())

    # the next start's job history (the service's JobManager, built here): the job is failed, and says why
    record = json.loads((state / "jobs" / f"{job_id}.json").read_text())
    assert record["state"] == "running"  # written when the job started
    cfg = load_config(None, environ={k: v for k, v in server_environ(state, env).items() if k.startswith("CEREBELLAR_NORSE_")})
    st = JobManager(cfg, lambda _v: None, lambda _x: None).get(job_id)
    assert st.state == "failed" and st.error is not None and "service stopped while the job was running" in st.error, st
    assert json.loads((state / "jobs" / f"{job_id}.json").read_text())["state"] == "failed"
