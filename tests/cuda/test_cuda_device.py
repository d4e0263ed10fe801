"""The CUDA backend on a GPU against the fused CPU backend (skipped without CUDA).

Same probabilities, spikes and states (max |diff| <= 1e-4) over 500 ticks of six
interleaved markets, batches that repeat markets, host resets and restores, with 1
and 4 streams, with and without CUDA graphs, in float64 and float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from cerebellar_norse.config import Config
from cerebellar_norse.cuda.backend import SHARED_WORKSPACE, CudaBackend, make_cuda_engine
from cerebellar_norse.cuda.device import cuda_memory, resolve_device
from cerebellar_norse.cuda.staging import workspace_bytes
from cerebellar_norse.errors import CapacityError
from cerebellar_norse.neurons.parameters import encoder_parameters, network_parameters
from cerebellar_norse.neurons.state import StateArrays
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.ticks import validate_ticks

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CfgFactory = Callable[..., Config]
RunPair = Callable[..., Any]


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("streams", [1, 4])
@pytest.mark.parametrize("use_graphs", [False, True])
def test_matches_fused(backend_pair: RunPair, cuda_cfg: CfgFactory, precision: str, streams: int, use_graphs: bool) -> None:
    cfg = cuda_cfg(precision, small=False)  # the default network
    rep, backend = backend_pair(cfg, device="cuda", streams=streams, use_graphs=use_graphs, n_ticks=500, markets=6)
    rep.check()
    assert rep.multi_wave_batches > 0
    if use_graphs:
        assert backend.graph_policy.captured, "no CUDA graph was captured"
        # graphs live in their stream's workspace pool (graphs.N: its rounding), or (torch without MemPool) in pools
        # of their own (graphs.N.B)
        charges = [k for k in backend.mem.budget.items() if k.startswith("graphs.")]
        assert all(k.count(".") == (1 if SHARED_WORKSPACE else 2) for k in charges), charges
        assert charges or SHARED_WORKSPACE
    else:
        assert not backend.graph_policy.captured
    used, total = cuda_memory()
    assert 0 < used <= total
    assert backend.memory_used_bytes > 0
    assert backend.memory_report()["pool_used_bytes"] > 0
    backend.close()


@pytest.mark.parametrize("streams", [1, 4])
def test_async_submissions_deeper_than_the_streams(backend_pair: RunPair, cuda_cfg: CfgFactory, streams: int) -> None:
    rep, backend = backend_pair(cuda_cfg("float32", small=False), device="cuda", streams=streams, use_graphs=True,
                                n_ticks=400, asynchronous=True)
    rep.check()
    backend.close()


def test_resolve_device_picks_cuda() -> None:
    assert resolve_device(Config.model_validate({"performance": {"device": "auto"}})) == "cuda"
    assert resolve_device(Config.model_validate({"performance": {"device": "cuda"}})) == "cuda"


def test_pool_is_reserved_on_the_device(cuda_cfg: CfgFactory) -> None:
    cfg = cuda_cfg("float32", small=False, performance={"memory_pool_size": "256MB"})
    p = network_parameters(cfg)
    before = torch.cuda.memory_allocated()
    be = CudaBackend.from_config(cfg, generate_weights(cfg), p, StateArrays.allocate(64, p, "float32"),
                                 encoder_parameters(cfg.neural))
    assert torch.cuda.memory_allocated() - before >= 256_000_000
    assert be.memory_report()["pool_bytes"] >= 256_000_000
    be.close()
    with pytest.raises(CapacityError, match="memory_limit"):
        CudaBackend.from_config(cuda_cfg("float32", small=False, performance={"memory_pool_size": "256MB", "memory_limit": "200MB"}),
                                generate_weights(cfg), p, StateArrays.allocate(64, p, "float32"), encoder_parameters(cfg.neural))


def test_engine_on_cuda(cuda_cfg: CfgFactory, tmp_path: Any) -> None:
    cfg = cuda_cfg("float32", small=False, performance={"batch_size": 32, "max_markets": 16})
    eng = make_cuda_engine(cfg)
    eng.warm_up()
    assert eng.backend.graph_policy.captured, "warm-up captures the single-tick graph"
    ticks = validate_ticks(generate_ticks(96, 8, 2))
    for i in range(0, len(ticks), 32):
        out = eng.process_now(ticks[i:i + 32])
        assert all(np.isfinite(r.prediction) for r in out)
    assert eng.save_state(tmp_path / "state.npz") == 8
    assert eng.health()["cuda"]["device"].startswith("cuda")
    eng.close()


@pytest.mark.parametrize("use_graphs", [False, True])
def test_batches_beyond_the_memory_limit_run_in_several_launches(backend_pair: RunPair, tight_cfg: Callable[..., Any],
                                                                 use_graphs: bool) -> None:
    cfg, plan = tight_cfg("float32", 2, 3)
    rep, backend = backend_pair(cfg, device="cuda", streams=2, use_graphs=use_graphs, n_ticks=300, asynchronous=True)
    rep.check()
    assert backend.launch_ticks == plan.launch_ticks == 3
    assert backend.memory_used_bytes <= int(cfg.performance.memory_limit)
    backend.close()


@pytest.mark.skipif(not SHARED_WORKSPACE, reason="needs torch.cuda.MemPool")
def test_graphs_and_eager_steps_share_the_workspace(backend_pair: RunPair, cuda_cfg: CfgFactory) -> None:
    # Cells enough that the caching allocator's segment rounding (2 and 20 MiB) is small beside a tick's workspace
    # (61 MB here): separate pools for the graphs of 1..4 ticks and the eager steps would hold several workspaces.
    # float64: in float32 one of 400,000 cells now and then crosses its threshold on one side and not the other
    cfg = cuda_cfg("float64", small=False, neural={"granule_size": 400_000})
    rep, backend = backend_pair(cfg, device="cuda", streams=1, use_graphs=True, n_ticks=160, markets=4, max_batch=4)
    rep.check()
    assert rep.multi_wave_batches > 0
    assert backend.launch_ticks == 4
    lane = backend._lanes[0]
    assert len(lane.graphs) >= 2, sorted(lane.graphs)
    workspace = workspace_bytes(backend.params.shape, backend.launch_ticks, 8)
    rounding = backend.mem.budget.items().get("graphs.0")
    charged = workspace + (rounding.nbytes if rounding is not None else 0)
    reserved = sum(seg["total_size"] for seg in torch.cuda.memory_snapshot(lane.pool.id))
    print(f"shared workspace pool: {reserved} bytes reserved, {workspace} + {charged - workspace} charged, "
          f"graphs of {sorted(lane.graphs)} ticks")
    assert 0 < reserved <= charged, (reserved, charged)
    assert charged - workspace <= workspace // 4  # rounding, not a second workspace per graph
    assert backend.mem.used <= backend.mem.budget.limit
    backend.close()


@pytest.mark.parametrize(("neural", "ticks"), [({}, 256), ({"granule_size": 24_000}, 12), ({"granule_size": 400_000}, 4)])
def test_workspace_estimate_bounds_what_a_step_allocates(cuda_cfg: CfgFactory, neural: dict[str, Any], ticks: int) -> None:
    cfg = cuda_cfg("float32", small=False, neural=neural)
    p = network_parameters(cfg)
    state = StateArrays.allocate(ticks, p, "float32")
    weights = generate_weights(cfg)
    for s in range(ticks):
        state.reset_slot(s, p, float(weights.golgi_init))
    be = CudaBackend(weights, p, state, encoder_parameters(cfg.neural), ticks, device="cuda", use_graphs=False)
    slots = np.arange(ticks, dtype=np.int64)
    stream = validate_ticks(generate_ticks(2 * ticks, ticks, 5))
    batches = [stream[:ticks], stream[ticks:]]
    be.step(slots, np.array([[t.price for t in batches[0]], [t.volume for t in batches[0]], [t.timestamp for t in batches[0]]]))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    be.step(slots, np.array([[t.price for t in batches[1]], [t.volume for t in batches[1]], [t.timestamp for t in batches[1]]]))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    print(f"workspace of {ticks} ticks, granule {p.shape.granule}: peak {peak} bytes, estimate {workspace_bytes(p.shape, ticks, 4)}")
    assert 0 < peak <= workspace_bytes(p.shape, ticks, 4), (peak, workspace_bytes(p.shape, ticks, 4))
    be.close()
