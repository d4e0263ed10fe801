"""Faults injected at the system-call level into a real service process with ``strace`` (its "Tampering" options),
as a tester outside the project would, rather than through the code's own seams.

* ``read`` of ``market_state.bin`` or of a journal file failing at start (EIO): the start stops with one line
  naming the file and the errno, nothing is moved aside, and the next start restores every acknowledged tick (a
  failed read used to move the file aside, and with it every market's state and the journal after it; a single one
  does so for ``market_state.bin``).

Skipped where ``strace`` is not installed or may not trace (no ptrace permission, e.g. in a container without
CAP_SYS_PTRACE).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import BASE_TS, REPO_ROOT, free_port, server_environ

from cerebellar_norse.config import load_config
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.journal import Durability
from cerebellar_norse.engine.persistence import STATE_FILE
from cerebellar_norse.engine.segments import JOURNAL_DIR, list_segments
from cerebellar_norse.neurons.encoder import S_N_TICKS
from cerebellar_norse.ticks import Tick


def strace_or_skip() -> str:
    """The strace binary, after checking it may trace here; skips the test otherwise."""
    path = shutil.which("strace")
    if path is None:
        pytest.skip("strace is not installed")
    probe = subprocess.run([path, "-qq", "-o", "/dev/null", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"strace may not trace here: {probe.stderr.strip()[:200]}")
    return path


def engine_of(state_dir: Path) -> tuple[Engine, Durability]:
    """The engine a service on ``state_dir`` runs (its default config, no model: the untrained network), recovered."""
    cfg = load_config(None, environ={k: v for k, v in server_environ(state_dir).items() if k.startswith("CEREBELLAR_NORSE_")})
    engine = Engine(cfg)
    durability = Durability(engine)
    durability.recover()
    return engine, durability


def counts(engine: Engine) -> dict[str, int]:
    return {m: int(engine.arrays.enc[s, S_N_TICKS]) for m, s in engine.pool.table.items()}


async def feed(engine: Engine, markets: list[str], first: int, n: int) -> None:
    for k in range(first, first + n):
        for m in markets:
            await engine.submit(Tick(price=100.0 + k % 7, volume=10.0 + k, timestamp=BASE_TS + 1000 * k, market_id=m))


@pytest.mark.slow
@pytest.mark.tools
@pytest.mark.parametrize("victim", ["market_state.bin", "journal file"])
def test_a_failed_read_of_a_state_file_at_start_stops_the_start_and_moves_nothing_aside(tmp_path: Path,
                                                                                        victim: str) -> None:
    strace = strace_or_skip()
    state_dir = tmp_path / "state"
    engine, durability = engine_of(state_dir)
    asyncio.run(feed(engine, ["A", "B"], 0, 20))
    asyncio.run(durability.checkpoint())  # market_state.bin holds these 40 ticks ...
    asyncio.run(feed(engine, ["A", "C"], 20, 10))  # ... and the journal these 20, as after a crash
    acked = counts(engine)
    durability.close(save=False)
    (_, segment), = list_segments(state_dir / JOURNAL_DIR)
    target = state_dir / STATE_FILE if victim == "market_state.bin" else segment
    before = sorted(p.name for p in state_dir.rglob("*"))

    # every read of the file fails (a disk that cannot read it for now); --seccomp-bpf: only reads stop the process
    proc = subprocess.Popen([strace, "-f", "--seccomp-bpf", "-qq", "-o", "/dev/null", "-P", str(target), "-e",
                             "trace=read", "-e", "inject=read:error=EIO:when=1+", "--",
                             sys.executable, "-m", "cerebellar_norse.cli", "--port", str(free_port())],
                            cwd=REPO_ROOT, env=server_environ(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:  # it served instead of refusing: fail, leaving no process behind
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert res.returncode == 1, (res.stdout[-2000:], res.stderr[-2000:])
    assert "Traceback" not in res.stdout + res.stderr and "Started server process" not in res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    what = "the market state" if victim == "market_state.bin" else "journal file"
    assert line == f"cerebellar-norse: cannot read {what} {target}: Input/output error (errno 5 EIO)"
    assert sorted(p.name for p in state_dir.rglob("*")) == before  # nothing moved aside, nothing removed

    engine2, durability2 = engine_of(state_dir)  # the next start, without the fault
    try:
        assert counts(engine2) == acked
    finally:
        durability2.close(save=False)
