"""The CUDA backend's host side, on any machine: device choice, memory budget, staging, scheduling.

The backend itself also runs here with ``device="cpu"`` (same code, no streams,
pinned memory or graphs) against the fused kernel, which checks the gather/scatter,
waves, staging order and host/device state ownership without a GPU.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cerebellar_norse.config import Config, PerformanceConfig
from cerebellar_norse.cuda import backend as cuda_backend
from cerebellar_norse.cuda import device as cuda_device
from cerebellar_norse.cuda.backend import CudaBackend, device_tick, make_cuda_engine
from cerebellar_norse.cuda.device import cuda_memory, resolve_device
from cerebellar_norse.cuda.memory import ALIGN, DeviceMemory, MemoryBudget, align_up
from cerebellar_norse.cuda.plan import launch_ticks
from cerebellar_norse.cuda.projections import SparseRows
from cerebellar_norse.cuda.staging import (
    GraphPolicy,
    RoundRobin,
    split_waves,
    staging_layout,
    wave_layout,
    workspace_bytes,
)
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.errors import (
    HOST_SHORTAGE_RETRY_S,
    CapacityError,
    DeviceMemoryError,
    DeviceUnavailableError,
    EngineFatalError,
    host_shortage_reason,
)
from cerebellar_norse.neurons.functional import cerebellum_tick
from cerebellar_norse.neurons.parameters import encoder_parameters, network_parameters, network_shape
from cerebellar_norse.neurons.reference import CerebellarReference
from cerebellar_norse.neurons.state import FLOAT_FIELDS, StateArrays
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.ticks import validate_ticks

CfgFactory = Callable[..., Config]
RunPair = Callable[..., Any]
REPO = Path(__file__).resolve().parents[2]


def _cfg(device: str) -> Config:
    return Config.model_validate({"performance": {"device": device}})


def _no_cuda_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> bool:
        raise AssertionError("torch.cuda was asked although performance.device is cpu")

    monkeypatch.setattr(torch.cuda, "is_available", boom)


# -- resolve_device ------------------------------------------------------------------------


def test_cpu_never_asks_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cuda_calls(monkeypatch)
    assert resolve_device(_cfg("cpu")) == "cpu"
    assert resolve_device(PerformanceConfig(device="cpu")) == "cpu"


@pytest.mark.parametrize(("available", "expected"), [(True, "cuda"), (False, "cpu")])
def test_auto_follows_cuda(monkeypatch: pytest.MonkeyPatch, available: bool, expected: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    assert resolve_device(_cfg("auto")) == expected


def test_cuda_with_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(_cfg("cuda")) == "cuda"


def test_cuda_without_cuda_is_an_error_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailableError) as info:
        resolve_device(_cfg("cuda"))
    msg = str(info.value)
    assert "performance.device" in msg
    assert '"cuda"' in msg and '"cpu"' in msg  # what is configured, and the fix
    assert isinstance(info.value, EngineFatalError)


def test_broken_driver_reads_as_no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> bool:
        raise RuntimeError("driver mismatch")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    assert resolve_device(_cfg("auto")) == "cpu"
    with pytest.raises(DeviceUnavailableError):
        resolve_device(_cfg("cuda"))


def test_reason_names_hidden_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceUnavailableError, match="CUDA_VISIBLE_DEVICES"):
        resolve_device(_cfg("cuda"))


# -- cuda_memory ---------------------------------------------------------------------------


def test_cuda_memory_is_zero_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_memory() == (0, 0)


def test_cuda_memory_is_zero_until_cuda_is_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: pytest.fail("must not create a CUDA context"))
    assert cuda_memory() == (0, 0)


def test_cuda_memory_reports_driver_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (30 * 2**30, 80 * 2**30))
    assert cuda_memory() == (50 * 2**30, 80 * 2**30)


def test_cuda_available_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_device.cuda_available()


# -- MemoryBudget ----------------------------------------------------------------------------


def test_budget_reserve_allocate_release() -> None:
    b = MemoryBudget(10_000_000)
    b.reserve_pool(4_000_000)
    assert b.used == align_up(4_000_000) and b.pool_used == 0
    state = b.allocate("state", 1_000_001, from_pool=True)
    assert state.offset == 0 and state.nbytes == align_up(1_000_001)
    assert b.used == align_up(4_000_000)  # pool allocations cost the limit nothing more
    w = b.allocate("weights", 3_000_000)
    assert w.offset is None and b.used == align_up(4_000_000) + 3_000_000
    host = b.allocate("staging.host.0", 1000, kind="host")
    rep = b.report()
    assert rep["host_pinned_bytes"] == 1000
    assert rep["device_bytes"] == align_up(4_000_000) + 3_000_000
    assert rep["pool_used_bytes"] == align_up(1_000_001)
    assert b.release("weights") == 3_000_000
    assert b.release(host.name) == 1000
    assert b.used == align_up(4_000_000)
    with pytest.raises(KeyError):
        b.release("weights")


def test_budget_refuses_over_limit_with_the_numbers() -> None:
    b = MemoryBudget(5_000_000)
    b.allocate("weights", 3_000_000)
    with pytest.raises(CapacityError) as info:
        b.allocate("staging.device.0", 2_500_000)
    msg = str(info.value)
    assert "performance.memory_limit" in msg
    assert "5000000 bytes" in msg and "2500000 bytes" in msg  # the limit and the request
    assert "5.50MB" in msg and "3.00MB" in msg  # the total it would reach and what is in use
    assert b.used == 3_000_000  # a refused allocation changes nothing
    b.allocate("staging.device.0", 2_000_000)  # exactly at the limit is fine
    assert b.available == 0


def test_budget_pool_refusals() -> None:
    b = MemoryBudget(1_000_000)
    with pytest.raises(CapacityError, match="memory_pool_size") as info:
        b.reserve_pool(2_000_000)
    assert "1000000 bytes" in str(info.value)
    b.reserve_pool(100_000)
    with pytest.raises(CapacityError, match="memory_pool_size"):
        b.allocate("state", 200_000, from_pool=True)
    with pytest.raises(ValueError, match="already reserved"):
        b.reserve_pool(10)


def test_budget_pool_first_fit_reuses_holes() -> None:
    b = MemoryBudget(10**9)
    b.reserve_pool(10 * ALIGN)
    a = b.allocate("a", 3 * ALIGN, from_pool=True)
    c = b.allocate("c", 3 * ALIGN, from_pool=True)
    assert (a.offset, c.offset) == (0, 3 * ALIGN)
    b.release("a")
    small = b.allocate("small", ALIGN + 1, from_pool=True)  # two aligned units, fits the hole at 0
    assert small.offset == 0
    big = b.allocate("big", 4 * ALIGN, from_pool=True)  # after c
    assert big.offset == 6 * ALIGN
    with pytest.raises(CapacityError):
        b.allocate("more", 2 * ALIGN, from_pool=True)
    with pytest.raises(ValueError, match="still holds"):
        b.release_pool()
    for name in ("small", "c", "big"):
        b.release(name)
    b.release_pool()
    assert b.used == 0


def test_budget_rejects_misuse() -> None:
    b = MemoryBudget(1000)
    b.allocate("x", 10)
    with pytest.raises(ValueError, match="exists"):
        b.allocate("x", 10)
    with pytest.raises(ValueError, match="no pool"):
        b.allocate("y", 10, from_pool=True)
    with pytest.raises(ValueError):
        b.allocate("z", -1)
    with pytest.raises(ValueError):
        MemoryBudget(0)


def test_device_memory_on_cpu_places_pool_tensors_in_the_arena() -> None:
    mem = DeviceMemory(torch.device("cpu"), limit=10_000_000, pool_size=1_000_000, pool_enabled=True, pin=False)
    assert mem.arena is not None and mem.used == align_up(1_000_000)
    s = mem.empty("state", (100, 7), torch.float32, from_pool=True)
    w = mem.empty("weights", (10, 10), torch.float64)
    assert s.untyped_storage().data_ptr() == mem.arena.untyped_storage().data_ptr()
    assert (s.data_ptr() - mem.arena.data_ptr()) % ALIGN == 0  # aligned within the arena
    assert w.untyped_storage().data_ptr() != mem.arena.untyped_storage().data_ptr()
    assert mem.used == align_up(1_000_000) + 800
    with pytest.raises(CapacityError, match="memory_limit"):
        mem.empty("huge", (10_000_000,), torch.float32)
    assert "huge" not in mem.budget.items()
    mem.close()
    assert mem.used == 0 and mem.arena is None


def test_device_memory_without_pool() -> None:
    mem = DeviceMemory(torch.device("cpu"), limit=1_000_000, pool_size=10**9, pool_enabled=False, pin=False)
    t = mem.empty("state", (1000,), torch.float64, from_pool=True)  # no pool: a plain, charged allocation
    assert mem.arena is None and mem.used == 8000 and t.shape == (1000,)


def test_the_device_refusing_memory_the_budget_allowed_is_a_shortage_of_gpu_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process holding the GPU's memory makes torch raise its OutOfMemoryError for an allocation within
    ``memory_limit``: a DeviceMemoryError (a host shortage, so the start stops instead of refusing the model being
    built), its charge released."""
    real_empty = torch.empty

    def device_full(*args: Any, **kwargs: Any) -> torch.Tensor:
        if args and args[0] in (4096, (4096,)):  # the pool or the tensor below; anything else allocates as usual
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 KiB.")
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", device_full)
    with pytest.raises(DeviceMemoryError) as pool:
        DeviceMemory(torch.device("cpu"), limit=1_000_000, pool_size=4096, pool_enabled=True, pin=False)
    assert isinstance(pool.value, CapacityError) and pool.value.retry_after_s == HOST_SHORTAGE_RETRY_S  # as host shortages
    assert host_shortage_reason(pool.value) == ("out of GPU memory (cannot reserve performance.memory_pool_size 4.10KB "
                                                "(4096 bytes) on cpu: the device is out of memory; lower "
                                                "memory_pool_size or free the GPU)")
    mem = DeviceMemory(torch.device("cpu"), limit=1_000_000, pool_size=4096, pool_enabled=False, pin=False)
    with pytest.raises(DeviceMemoryError, match=r"^weights: the device ran out of memory allocating 4.10KB \(4096 bytes\)$"):
        mem.empty("weights", (4096,), torch.uint8)
    assert mem.used == 0 and "weights" not in mem.budget.items()
    assert mem.empty("weights", (4095,), torch.uint8).shape == (4095,)


# -- staging, rotation, waves, graphs --------------------------------------------------------


def test_round_robin() -> None:
    rr = RoundRobin(3)
    assert rr.peek() == 0
    assert [rr.next() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert rr.peek() == 1
    assert [RoundRobin(1).next() for _ in range(3)] == [0, 0, 0]
    with pytest.raises(ValueError):
        RoundRobin(0)


def test_staging_layout_sizes() -> None:
    shape = network_parameters(Config()).shape  # mossy 48, classes 3
    lay = staging_layout(256, shape, 4)
    assert lay.in_bytes == 256 * (8 + 48 * 4)
    assert lay.out_bytes == 256 * (3 * 8 + 3 * 8)
    assert lay.host_bytes == lay.device_bytes == lay.in_bytes + lay.out_bytes
    assert sum(int(np.prod(shp)) * dt.itemsize for _, shp, dt in lay.buffers()) == lay.host_bytes
    assert staging_layout(256, shape, 8).in_bytes == 256 * (8 + 48 * 8)
    assert [n for n, _, _ in lay.buffers()] == ["slots", "mossy", "probs", "spikes"]
    with pytest.raises(ValueError):
        staging_layout(0, shape, 4)
    with pytest.raises(ValueError):
        staging_layout(8, shape, 2)


def test_workspace_estimate() -> None:
    shape = network_parameters(Config()).shape
    one, many = workspace_bytes(shape, 1, 4), workspace_bytes(shape, 1024, 4)
    assert one % (1 << 20) == 0 and many % (1 << 20) == 0
    assert many > one > 0
    assert workspace_bytes(shape, 1024, 8) >= many
    # at least the gathered and new state of every row
    assert many >= 1024 * 2 * 2 * (shape.granule + shape.purkinje + shape.dcn) * 4


def test_split_waves_cuts_each_wave_in_order() -> None:
    assert split_waves([(0, 5), (5, 7)], 2) == [(0, 2), (2, 4), (4, 5), (5, 7)]
    assert split_waves([(0, 3), (3, 4)], 3) == [(0, 3), (3, 4)]
    assert split_waves([(0, 12)], 12) == [(0, 12)]
    assert split_waves([], 4) == []
    with pytest.raises(ValueError, match="at least 1"):
        split_waves([(0, 1)], 0)


def test_launch_ticks_is_the_largest_count_whose_workspaces_fit() -> None:
    shape = network_shape(Config.model_validate({"neural": {"granule_size": 24_000}}).neural)

    def ws(n: int) -> int:
        return workspace_bytes(shape, n, 4)

    assert launch_ticks(shape, 4, 64, 2, 2 * ws(64)) == 64
    assert launch_ticks(shape, 4, 64, 2, 10**15) == 64  # never more than the batch
    for n in (1, 5, 17):
        assert launch_ticks(shape, 4, 64, 2, 2 * ws(n)) == n
        assert launch_ticks(shape, 4, 64, 2, 2 * ws(n + 1) - 1) == n
    assert launch_ticks(shape, 4, 64, 2, 2 * ws(1) - 1) == 0
    assert launch_ticks(shape, 4, 64, 3, 2 * ws(1)) == 0  # three streams need three workspaces


def test_wave_layout_distinct_batch_keeps_order() -> None:
    assert wave_layout(np.array([], dtype=np.int64)) == (None, [])
    assert wave_layout(np.array([5], dtype=np.int64)) == (None, [(0, 1)])
    assert wave_layout(np.array([3, 1, 2], dtype=np.int64)) == (None, [(0, 3)])


def test_wave_layout_repeats() -> None:
    slots = np.array([4, 7, 4, 4, 9, 7], dtype=np.int64)
    perm, bounds = wave_layout(slots)
    assert perm is not None
    assert bounds == [(0, 3), (3, 5), (5, 6)]
    staged = slots[perm]
    for a, e in bounds:
        assert len(set(staged[a:e].tolist())) == e - a  # a wave never repeats a slot
    assert sorted(perm.tolist()) == list(range(6))
    for s in (4, 7):  # each market's ticks stay in arrival order
        positions = [int(p) for p in perm if slots[p] == s]
        assert positions == sorted(positions)


def test_graph_policy() -> None:
    off = GraphPolicy(False)
    assert [off.decide(("s", 1)) for _ in range(5)] == ["eager"] * 5
    pol = GraphPolicy(True, warmup=2, max_graphs=2)
    assert [pol.decide((0, 8)) for _ in range(3)] == ["eager", "eager", "capture"]
    pol.record_captured((0, 8))
    assert pol.decide((0, 8)) == "replay"
    assert pol.decide((0, 8), eligible=False) == "eager"  # multi-wave batches never use graphs
    assert pol.decide((1, 8)) == "eager"  # per stream
    assert [pol.decide((0, 4)) for _ in range(3)] == ["eager", "eager", "capture"]
    pol.record_refused((0, 4))
    assert pol.decide((0, 4)) == "eager"
    pol.record_captured((1, 2))
    assert [pol.decide((0, 16)) for _ in range(4)] == ["eager"] * 4  # max_graphs reached
    pol.forget()
    assert pol.decide((0, 8)) == "eager"
    with pytest.raises(ValueError):
        GraphPolicy(True, warmup=0)


# -- imports and construction without CUDA --------------------------------------------------


def test_package_imports_without_touching_cuda() -> None:
    code = ("import torch, cerebellar_norse.cuda as c, cerebellar_norse.cuda.backend as b; "
            "assert not torch.cuda.is_initialized(); assert c.CudaBackend is b.CudaBackend; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the host without CUDA")
def test_backend_on_cuda_without_cuda_is_an_error() -> None:
    cfg = Config()
    p = network_parameters(cfg)
    with pytest.raises(DeviceUnavailableError, match=r"performance\.device"):
        CudaBackend(generate_weights(cfg), p, StateArrays.allocate(2, p, "float32"), encoder_parameters(cfg.neural), 4)


# -- the backend's code path on the CPU -----------------------------------------------------


def _leaves(x: Any) -> list[torch.Tensor]:
    """Tensors of a (nested) state tuple, in field order."""
    if isinstance(x, torch.Tensor):
        return [x]
    assert isinstance(x, tuple)
    return [leaf for item in x for leaf in _leaves(item)]


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_device_tick_is_cerebellum_tick(cuda_cfg: CfgFactory, precision: str) -> None:
    cfg = cuda_cfg(precision)
    p = network_parameters(cfg)
    ref = CerebellarReference(generate_weights(cfg), p)
    with torch.no_grad():
        w = ref.dense_weights()
        gen = torch.Generator().manual_seed(1)
        mossy = torch.rand(5, p.shape.mossy, generator=gen, dtype=p.dtype) * 2.0
        state = ref.initial_state(5)
        for _ in range(20):
            a, sa = cerebellum_tick(mossy, state, w, p)
            b, sb = device_tick(mossy, state, w, p)
            assert torch.equal(a.logits, b.logits) and torch.equal(a.spikes, b.spikes)
            for x, y in zip(_leaves(sa), _leaves(sb), strict=True):
                assert torch.equal(x, y)
            state = sa


def test_the_gathered_projections_are_the_dense_products() -> None:
    cfg = Config.model_validate({"neural": {"precision": "float64"}})
    p, weights = network_parameters(cfg), generate_weights(cfg)
    dense = CerebellarReference(weights, p).dense_weights()
    w_mg = SparseRows(torch.as_tensor(weights.mg_idx, dtype=torch.long), torch.as_tensor(weights.mg_w))
    w_pf = SparseRows(torch.as_tensor(weights.pf_pre, dtype=torch.long), torch.as_tensor(weights.pf_w)).T
    gen = torch.Generator().manual_seed(2)
    mossy = torch.rand(7, p.shape.mossy, generator=gen, dtype=torch.float64)
    z_gr = (torch.rand(7, p.shape.granule, generator=gen) < 0.1).to(torch.float64)
    with torch.no_grad():
        assert torch.allclose(mossy @ w_mg.T, mossy @ dense.w_mg.T, rtol=0, atol=1e-12)
        assert torch.allclose(z_gr @ w_pf, z_gr @ dense.w_pf, rtol=0, atol=1e-12)
        gathered = dense._replace(w_mg=w_mg, w_pf=w_pf)  # what the backend steps with
        state = CerebellarReference(weights, p).initial_state(7)
        for _ in range(10):
            a, sa = cerebellum_tick(mossy, state, dense, p)
            b, sb = device_tick(mossy, state, gathered, p)  # type: ignore[arg-type]
            assert torch.allclose(a.logits, b.logits, rtol=0, atol=1e-9) and torch.equal(a.spikes, b.spikes)
            for x, y in zip(_leaves(sa), _leaves(sb), strict=True):
                assert torch.allclose(x, y, rtol=0, atol=1e-9)
            state = sa
    with pytest.raises(ValueError, match="same"):
        SparseRows(torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, 3))


@pytest.mark.parametrize(("precision", "streams", "asynchronous"), [("float64", 1, False), ("float32", 3, True)])
def test_cpu_path_matches_fused(backend_pair: RunPair, cuda_cfg: CfgFactory, precision: str, streams: int,
                                asynchronous: bool) -> None:
    cfg = cuda_cfg(precision)
    rep, backend = backend_pair(cfg, device="cpu", streams=streams, n_ticks=240, asynchronous=asynchronous)
    rep.check()
    assert rep.multi_wave_batches > 0  # repeated markets were exercised
    assert backend.streams == streams
    assert backend.memory_used_bytes > 0
    backend.close()


@pytest.mark.parametrize(("streams", "asynchronous"), [(1, False), (2, True)])
def test_batches_beyond_the_memory_limit_run_in_several_launches(backend_pair: RunPair, tight_cfg: Callable[..., Any],
                                                                 monkeypatch: pytest.MonkeyPatch, streams: int,
                                                                 asynchronous: bool) -> None:
    cfg, plan = tight_cfg("float32", streams, 3)
    waves: list[int] = []
    launches: list[int] = []
    compute = CudaBackend._compute

    def spy_split(bounds: list[tuple[int, int]], most: int) -> list[tuple[int, int]]:
        waves.extend(e - a for a, e in bounds)
        return split_waves(bounds, most)

    def spy_compute(self: CudaBackend, lane: Any, bounds: list[tuple[int, int]]) -> None:
        launches.extend(e - a for a, e in bounds)
        compute(self, lane, bounds)

    monkeypatch.setattr(cuda_backend, "split_waves", spy_split)
    monkeypatch.setattr(CudaBackend, "_compute", spy_compute)
    rep, backend = backend_pair(cfg, device="cpu", streams=streams, n_ticks=200, asynchronous=asynchronous)
    rep.check()  # same answers and states as the fused kernel
    assert backend.launch_ticks == plan.launch_ticks == 3
    assert backend.describe()["launch_ticks"] == 3
    assert max(waves) == 6 and max(launches) == 3  # waves of up to six markets went in launches of up to three
    assert sum(launches) == sum(waves) == 200
    items = backend.mem.budget.items()
    assert all(items[f"workspace.{i}"].nbytes == plan.workspace for i in range(streams))
    assert backend.memory_used_bytes == plan.fixed + streams * plan.workspace <= int(cfg.performance.memory_limit)
    backend.close()


def test_no_room_for_one_tick_is_refused_at_start(tight_cfg: Callable[..., Any]) -> None:
    cfg, _ = tight_cfg("float32", 2, 1)
    p = network_parameters(cfg)
    with pytest.raises(CapacityError, match=r"one tick.*2 stream\(s\).*performance\.memory_limit"):
        CudaBackend(generate_weights(cfg), p, StateArrays.allocate(7, p, "float32"), encoder_parameters(cfg.neural), 12,
                    streams=2, device="cpu", memory_limit=int(cfg.performance.memory_limit) - 1)


def test_staging_buffers_follow_the_layout(cuda_cfg: CfgFactory) -> None:
    cfg = cuda_cfg("float32")
    p = network_parameters(cfg)
    be = CudaBackend(generate_weights(cfg), p, StateArrays.allocate(4, p, "float32"), encoder_parameters(cfg.neural), 16,
                     streams=2, device="cpu")
    items = be.mem.budget.items()
    lay = staging_layout(16, p.shape, 4)
    for lane in range(2):
        assert sum(a.nbytes for n, a in items.items() if n.startswith(f"staging.host.{lane}.")) == lay.host_bytes
        assert sum(a.nbytes for n, a in items.items() if n.startswith(f"staging.device.{lane}.")) == lay.device_bytes
        assert items[f"workspace.{lane}"].nbytes == workspace_bytes(p.shape, 16, 4)
    assert items["state"].offset == 0  # in the pool
    be.close()


def test_memory_limit_and_pool_are_enforced(cuda_cfg: CfgFactory) -> None:
    cfg = cuda_cfg("float32")
    p, w, enc = network_parameters(cfg), generate_weights(cfg), encoder_parameters(cfg.neural)
    with pytest.raises(CapacityError, match=r"performance\.memory_limit"):
        CudaBackend(w, p, StateArrays.allocate(4, p, "float32"), enc, 16, device="cpu", memory_limit=2_000_000, pool_size=1_000_000)
    with pytest.raises(CapacityError, match="memory_pool_size"):
        CudaBackend(w, p, StateArrays.allocate(1000, p, "float32"), enc, 16, device="cpu", pool_size=100_000)
    ok = CudaBackend(w, p, StateArrays.allocate(1000, p, "float32"), enc, 16, device="cpu", pool_enabled=False)
    assert ok.memory_report()["pool_bytes"] == 0
    ok.close()


def test_batch_checks_and_empty_batch(cuda_cfg: CfgFactory) -> None:
    cfg = cuda_cfg("float64")
    p = network_parameters(cfg)
    be = CudaBackend(generate_weights(cfg), p, StateArrays.allocate(4, p, "float64"), encoder_parameters(cfg.neural), 4, device="cpu")
    probs, spikes = be.step(np.zeros(0, dtype=np.int64), np.zeros((3, 0)))
    assert probs.shape == (0, 3) and spikes.shape == (0, 3)
    with pytest.raises(ValueError, match="exceeds"):
        be.step(np.zeros(5, dtype=np.int64), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="shape"):
        be.step(np.zeros(2, dtype=np.int64), np.zeros((3, 3)))
    be.close()
    with pytest.raises(EngineFatalError, match="closed"):
        be.step(np.zeros(1, dtype=np.int64), np.zeros((3, 1)))


def test_set_weights_matches_fused_after_a_swap(cuda_cfg: CfgFactory) -> None:
    cfg = cuda_cfg("float64")
    p, enc = network_parameters(cfg), encoder_parameters(cfg.neural)
    w0 = generate_weights(cfg)
    w1 = w0.copy()
    w1.pf_w *= 1.5
    w1.w_out = w1.w_out[::-1].copy()
    from cerebellar_norse.neurons.backends import FusedBackend

    fa, ca = StateArrays.allocate(3, p, "float64"), StateArrays.allocate(3, p, "float64")
    for s in range(3):
        fa.reset_slot(s, p, float(w0.golgi_init))
        ca.reset_slot(s, p, float(w0.golgi_init))
    fused, cuda = FusedBackend(w0, p, fa, enc, 8), CudaBackend(w0, p, ca, enc, 8, device="cpu")
    ticks = validate_ticks(generate_ticks(60, 3, 5))
    slot_of = {m: k for k, m in enumerate(sorted({t.market_id for t in ticks}))}
    for k, t in enumerate(ticks):
        if k == 30:
            fused.set_weights(w1)
            cuda.set_weights(w1)
        slots = np.array([slot_of[t.market_id]], dtype=np.int64)
        arr = np.array([[t.price], [t.volume], [t.timestamp]], dtype=np.float64)
        a, b = fused.step(slots, arr)[0].copy(), cuda.step(slots, arr)[0]
        assert np.abs(a - b).max() <= 1e-12
    bad = generate_weights(cuda_cfg("float64", neural={"dcn_size": 9}))
    with pytest.raises(ValueError, match="do not match"):
        cuda.set_weights(bad)


def test_sync_to_host_leaves_host_owned_slots_alone(cuda_cfg: CfgFactory) -> None:
    cfg = cuda_cfg("float64")
    p, w, enc = network_parameters(cfg), generate_weights(cfg), encoder_parameters(cfg.neural)
    st = StateArrays.allocate(8, p, "float64")
    for s in range(8):
        st.reset_slot(s, p, float(w.golgi_init))
    be = CudaBackend(w, p, st, enc, 4, device="cpu")
    for t in validate_ticks(generate_ticks(20, 2, 1)):
        be.step(np.array([int(t.market_id[1:])], dtype=np.int64), np.array([[t.price], [t.volume], [t.timestamp]], dtype=np.float64))
    assert (st.v_gr[1] == float(p.granule.v_leak)).all()  # the host is not updated by a step
    assert be.sync_to_host([1]) == 1  # one slot: gathered on the device
    one = st.read_slot(1)
    assert not (one["v_gr"] == float(p.granule.v_leak)).all()
    assert be.sync_to_host() == 2  # the two ticked slots (whole-buffer copy); the others never ticked
    for name, value in st.read_slot(1).items():
        assert np.array_equal(value, one[name])
    st.reset_slot(0, p, float(w.golgi_init))  # the host resets slot 0 (a new market)
    st.v_gr[2] = 0.25  # and writes slot 2, which has seen no tick
    assert be.sync_to_host() == 1  # only slot 1 is device-owned now
    assert (st.v_gr[0] == float(p.granule.v_leak)).all() and (st.v_gr[2] == 0.25).all()
    assert be.sync_to_host([0, 2]) == 0
    be.close()


def fused_and_cuda_on_cpu(cuda_cfg: CfgFactory, state_dir: Path) -> tuple[Config, Engine, Engine]:
    """A float64 config (batches of 16, 8 markets, state under ``state_dir``), a fused engine and a CUDA-backend engine on CPU."""
    cfg = cuda_cfg("float64", performance={"batch_size": 16, "max_markets": 8})
    cfg = cfg.model_copy(update={"paths": cfg.paths.model_copy(update={"state_dir": state_dir})})
    return cfg, Engine(cfg), make_cuda_engine(cfg, device="cpu")


def test_cuda_engine_on_cpu_saves_what_the_fused_engine_saves(cuda_cfg: CfgFactory, tmp_path: Path) -> None:
    cfg, ref, eng = fused_and_cuda_on_cpu(cuda_cfg, tmp_path)
    ticks = validate_ticks(generate_ticks(120, 5, 9))
    for i in range(0, len(ticks), 16):
        a, b = ref.process_now(ticks[i:i + 16]), eng.process_now(ticks[i:i + 16])
        assert [r.spike_count for r in a] == [r.spike_count for r in b]
        assert max(abs(x.prediction - y.prediction) for x, y in zip(a, b, strict=True)) <= 1e-12
    assert eng.save_state(tmp_path / "cuda.npz") == 5
    # The host arrays now hold the device state: equal to the fused engine's.
    for name in FLOAT_FIELDS:
        assert np.abs(getattr(ref.arrays, name) - getattr(eng.arrays, name)).max() <= 1e-12
    restored = make_cuda_engine(cfg, device="cpu")
    assert restored.restore_state(tmp_path / "cuda.npz") == 5
    more = validate_ticks(generate_ticks(140, 5, 9))[120:]
    for i in range(0, len(more), 16):
        a, b = ref.process_now(more[i:i + 16]), restored.process_now(more[i:i + 16])
        assert max(abs(x.prediction - y.prediction) for x, y in zip(a, b, strict=True)) <= 1e-12
    assert eng.health()["cuda"]["backend"] == "cuda"
    eng.close()
    restored.close()


def test_a_batch_the_device_has_no_memory_for_is_refused_unapplied_and_can_be_sent_again(
        cuda_cfg: CfgFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's OutOfMemoryError inside a step (another process took the GPU's memory since the warm-up) refuses the
    batch with a DeviceMemoryError (503 capacity, Retry-After) before any state changed; sent again once the memory
    is back, every answer and state is that of an engine that never failed. Once a wave's states were written back
    the batch is no longer whole: that stays an engine error."""
    _, ref, eng = fused_and_cuda_on_cpu(cuda_cfg, tmp_path)
    ticks = validate_ticks(generate_ticks(80, 5, 3))
    head, failing, tail = ticks[:32], ticks[32:48], ticks[48:]  # 16 ticks of 5 markets: several waves
    for part in (head[:16], head[16:]):
        ref.process_now(part)
        eng.process_now(part)
    real, calls = cuda_backend.device_tick, []

    def no_memory_at(call: int, exc: Exception | None = None) -> Callable[..., Any]:
        def device_tick(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if len(calls) == call:
                raise exc or torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")
            return real(*args, **kwargs)
        return device_tick

    monkeypatch.setattr(cuda_backend, "device_tick", no_memory_at(1))
    with pytest.raises(DeviceMemoryError, match=r"^the GPU ran out of memory stepping a batch of 16 tick\(s\) on cpu "
                       r"\(out of GPU memory \(OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB.\)\); "
                       "nothing of the batch was applied") as refused:
        asyncio.run(eng.submit_many(failing))
    assert refused.value.retry_after_s == HOST_SHORTAGE_RETRY_S and eng.stats.failed_batches == 1
    monkeypatch.setattr(cuda_backend, "device_tick", real)
    for part in (failing, tail[:16], tail[16:]):
        a, b = ref.process_now(part), eng.process_now(part)
        assert [r.spike_count for r in a] == [r.spike_count for r in b]
        assert [r.prediction for r in a] == pytest.approx([r.prediction for r in b], abs=1e-12)
    eng.save_state(tmp_path / "cuda.npz")
    for name in FLOAT_FIELDS:
        assert np.abs(getattr(ref.arrays, name) - getattr(eng.arrays, name)).max() <= 1e-12
    assert np.array_equal(ref.arrays.enc, eng.arrays.enc)
    calls.clear()
    monkeypatch.setattr(cuda_backend, "device_tick", no_memory_at(2))  # the first wave is written back already
    with pytest.raises(EngineFatalError, match="batch failed"):
        asyncio.run(eng.submit_many(validate_ticks(generate_ticks(100, 5, 3))[80:96]))
    calls.clear()  # nor is the backend's own refusal (its budget, a tensor it places) once a wave was written back
    monkeypatch.setattr(cuda_backend, "device_tick", no_memory_at(2, DeviceMemoryError("weights: the device ran out")))
    with pytest.raises(EngineFatalError, match="batch failed: EngineFatalError: cuda backend: step failed on cpu: weights"):
        asyncio.run(eng.submit_many(validate_ticks(generate_ticks(120, 5, 3))[100:116]))
    eng.close()
    ref.close()


def test_a_request_refused_for_want_of_gpu_memory_after_a_step_of_it_was_applied_is_an_engine_error(
        cuda_cfg: CfgFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request of more ticks than ``batch_size`` runs in several steps: the second refused for want of GPU memory
    after the first was applied is no "try again" (503 capacity) for the request, whose resent first half would be
    refused as already seen, but an engine error naming what was applied."""
    _, _, eng = fused_and_cuda_on_cpu(cuda_cfg, tmp_path)  # batch_size 16
    real, enqueued = eng.backend._enqueue, []

    def second_has_no_memory(*args: Any, **kwargs: Any) -> None:
        enqueued.append(1)
        if len(enqueued) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")
        real(*args, **kwargs)

    monkeypatch.setattr(eng.backend, "_enqueue", second_has_no_memory)
    with pytest.raises(EngineFatalError, match=r"^16 of the 32 ticks were applied, the others refused: the GPU ran out "
                       r"of memory stepping a batch of 16 tick\(s\)") as partly:
        asyncio.run(eng.submit_many(validate_ticks(generate_ticks(32, 4, 6))))
    assert isinstance(partly.value.__cause__, DeviceMemoryError)
    with pytest.raises(DeviceMemoryError):  # nothing of it applied: try again
        enqueued.clear()
        asyncio.run(eng.submit_many(validate_ticks(generate_ticks(64, 4, 6))[48:56]))
        asyncio.run(eng.submit_many(validate_ticks(generate_ticks(64, 4, 6))[56:]))
    assert len(enqueued) == 2
    eng.close()


def test_debug_state_and_handover_export_read_the_device_state(cuda_cfg: CfgFactory, tmp_path: Path) -> None:
    from cerebellar_norse.engine.handover import export_market, read_export
    from cerebellar_norse.observability.debugtools import market_state

    _, ref, eng = fused_and_cuda_on_cpu(cuda_cfg, tmp_path)
    ticks = validate_ticks(generate_ticks(60, 3, 4))
    for i in range(0, len(ticks), 16):
        ref.process_now(ticks[i:i + 16])
        eng.process_now(ticks[i:i + 16])
    market = ticks[-1].market_id
    a, b = market_state(ref, market), market_state(eng, market)
    assert a is not None and b is not None
    for pop in ("granule", "purkinje", "dcn"):  # the device's potentials, not the host's stale copy
        assert abs(a["populations"][pop]["v"]["mean"] - b["populations"][pop]["v"]["mean"]) <= 1e-12
    data_ref, data_dev = export_market(ref, market), export_market(eng, market)
    assert data_ref is not None and data_dev is not None
    (_, s_ref), (_, s_dev) = read_export(data_ref), read_export(data_dev)
    for name in FLOAT_FIELDS:
        assert np.abs(s_ref[name] - s_dev[name]).max() <= 1e-12
    eng.close()
