"""A service started on a GPU whose memory another process holds (skipped without CUDA).

The entry below takes all but :data:`LEFT` bytes of the GPU's free memory before the service starts, as another
process on the same GPU would: the memory pool the CUDA backend reserves for its market states
(``performance.memory_pool_size``, 64 MB built in) no longer fits. That is the host's to fix, not the model's: the start
stops (exit 1) with one line naming the model, GPU memory and what to do, and nothing in the state dir is moved aside
or rewritten (refusing the model as one that cannot be served would serve another and move aside the market states
saved with it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import REPO_ROOT, free_port, server_environ, tree_of

from cerebellar_norse.config import load_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.training.checkpoints import ModelStore

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

VERSION = "20240101T000000Z-aaaaaa"
LEFT = 32 << 20  # bytes of GPU memory left free: less than the built-in 64 MB pool

HOGGED_ENTRY = f"""
import sys, torch
free, _ = torch.cuda.mem_get_info()
held = torch.empty(free - {LEFT}, dtype=torch.uint8, device="cuda")  # another process's memory, as far as we are concerned
from cerebellar_norse.cli import run
sys.argv = ["cerebellar-norse", *sys.argv[1:]]
sys.exit(run())
"""


def start_on_a_full_gpu(state: Path) -> subprocess.CompletedProcess[str]:
    env = server_environ(state, {"CEREBELLAR_NORSE_PERFORMANCE__DEVICE": "cuda"})
    return subprocess.run([sys.executable, "-c", HOGGED_ENTRY, "--port", str(free_port())], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("cerebellar-norse: ")]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def test_no_gpu_memory_for_the_engine_of_the_active_model_stops_the_start_and_moves_nothing_aside(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg = load_config(None, environ={})
    store = ModelStore(state)
    store.save(generate_weights(cfg), cfg, {"validation": {"loss": 0.9}}, version=VERSION)
    store.set_active(VERSION)
    (state / "market_state.bin").write_bytes(b"saved with the active model")  # must not be moved aside or rewritten
    before = tree_of(state)
    line = one_line(start_on_a_full_gpu(state))
    assert line.startswith(f"cerebellar-norse: cannot build the engine of model {VERSION} "
                           f"({state / 'models' / VERSION}): out of GPU memory ("), line
    assert "nothing is moved aside" in line, line
    after = tree_of(state)
    after.pop(".lock", None)  # the state dir's lock, taken before the model is loaded
    assert after == before


def test_no_gpu_memory_for_the_untrained_network_is_one_line(tmp_path: Path) -> None:
    line = one_line(start_on_a_full_gpu(tmp_path / "state"))
    assert "out of memory" in line and ("GPU" in line or "device" in line), line
