"""The service on a GPU whose memory another process holds (skipped without CUDA).

At start: the entry below takes all but :data:`LEFT` bytes of the GPU's free memory before the service starts, as another
process on the same GPU would: the memory pool the CUDA backend reserves for its market states
(``performance.memory_pool_size``, 64 MB built in) no longer fits. That is the host's to fix, not the model's: the start
stops (exit 1) with one line naming the model, GPU memory and what to do, and nothing in the state dir is moved aside
or rewritten (refusing the model as one that cannot be served would serve another and move aside the market states
saved with it).

While serving: a step whose intermediates the GPU has no memory for is refused whole (503 ``capacity``), no state
changed, and the same ticks sent again once there is memory give what an engine that never failed gives.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import REPO_ROOT, failed_start_line, free_port, server_environ, tree_of, with_active_model

from cerebellar_norse.config import Config
from cerebellar_norse.cuda.backend import make_cuda_engine
from cerebellar_norse.errors import DeviceMemoryError
from cerebellar_norse.neurons.state import FLOAT_FIELDS
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.ticks import validate_ticks

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


def test_no_gpu_memory_for_the_engine_of_the_active_model_stops_the_start_and_moves_nothing_aside(tmp_path: Path) -> None:
    state = tmp_path / "state"
    before = with_active_model(state, VERSION)
    line = failed_start_line(start_on_a_full_gpu(state))
    assert line.startswith(f"cerebellar-norse: cannot build the engine of model {VERSION} "
                           f"({state / 'models' / VERSION}): out of GPU memory ("), line
    assert "nothing is moved aside" in line, line
    after = tree_of(state)
    after.pop(".lock", None)  # the state dir's lock, taken before the model is loaded
    assert after == before


def test_no_gpu_memory_for_the_untrained_network_is_one_line(tmp_path: Path) -> None:
    line = failed_start_line(start_on_a_full_gpu(tmp_path / "state"))
    assert "out of memory" in line and ("GPU" in line or "device" in line), line


def test_a_step_the_gpu_has_no_memory_for_is_refused_unapplied_and_can_be_sent_again(
        cuda_cfg: Callable[..., Config]) -> None:
    cfg = cuda_cfg("float32", small=False, performance={"batch_size": 32, "max_markets": 16})
    ref, eng = make_cuda_engine(cfg, use_graphs=False), make_cuda_engine(cfg, use_graphs=False)  # eager steps allocate
    ticks = validate_ticks(generate_ticks(96, 6, 5))
    head, failing, tail = ticks[:32], ticks[32:64], ticks[64:]
    ref.process_now(head)
    eng.process_now(head)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the step's cached blocks go back to the driver
    _, total = torch.cuda.mem_get_info()
    # the caching allocator may keep what it holds and no more, and the free parts of what it holds are taken: the
    # next step's intermediates need memory the device does not give
    torch.cuda.set_per_process_memory_fraction(torch.cuda.memory_reserved() / total)
    taken = []
    for size in (8 << 20, 1 << 20, 1 << 16, 1 << 12, 512):
        try:
            while True:
                taken.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            pass
    try:
        with pytest.raises(DeviceMemoryError, match=r"^the GPU ran out of memory stepping a batch of 32 tick\(s\) on "
                           r"cuda:0 \(out of GPU memory \(OutOfMemoryError: CUDA out of memory.*nothing of the batch "
                           "was applied"):
            asyncio.run(eng.submit_many(failing))
    finally:
        taken.clear()
        torch.cuda.set_per_process_memory_fraction(1.0)
    a, b = ref.process_now(failing), eng.process_now(failing)
    a += ref.process_now(tail)
    b += eng.process_now(tail)
    assert [r.spike_count for r in a] == [r.spike_count for r in b]
    assert [r.prediction for r in a] == pytest.approx([r.prediction for r in b], abs=1e-5)
    ref.backend.sync_to_host()
    eng.backend.sync_to_host()
    for name in FLOAT_FIELDS:
        assert np.abs(getattr(ref.arrays, name) - getattr(eng.arrays, name)).max() <= 1e-5, name
    assert np.array_equal(ref.arrays.enc, eng.arrays.enc)
    eng.close()
    ref.close()
