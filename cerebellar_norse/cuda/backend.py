"""CUDA backend: the Norse reference equations on the GPU, with streams and CUDA graphs.

Implements the engine's :class:`~cerebellar_norse.neurons.backends.Backend` protocol
(``step(slots, ticks) -> (probs, spikes)``, ``set_weights``) and an asynchronous
variant (``submit(slots, ticks) -> handle``, ``wait(handle)``; ``step`` is the two in
a row).

Maths. One tick is :func:`cerebellar_norse.neurons.functional.cerebellum_step`
applied ``steps_per_tick`` times with the tick's mossy currents, exactly the loop of
:func:`~cerebellar_norse.neurons.functional.cerebellum_tick` (see :func:`device_tick`,
which only adds the device of the spike accumulator). The small layers' weights are
dense; the two sparse projections (mossy -> granule, parallel fibres) are held as index
and value rows and applied as gathers (:mod:`~cerebellar_norse.cuda.projections`): the
same sums as the dense weights of :meth:`CerebellarReference.dense_weights`, without
reading their zeros (4 GB of them per step for the production network). Units are those of
:mod:`~cerebellar_norse.neurons.functional`: dimensionless potentials (threshold 1)
and per-step current jumps, ``dt`` in s, inverse time constants in 1/s. Class
probabilities are the float64 softmax of ``readout_scale * v_out``; spikes are counts
per population (granule, Purkinje, DCN) over the tick. The parameters stay 0-dim CPU
tensors, which CUDA kernels take as scalars (and CUDA graphs bake in); no default
device is set, so nothing in a step copies from pageable host memory.

Where things live.

* Weights and every per-slot neuron state variable are resident on the device. The
  state is one flat device buffer with the same layout as the host
  :class:`~cerebellar_norse.neurons.state.StateArrays` ``flat`` buffer (one
  contiguous (S, n) block per variable), placed in the memory pool when
  ``performance.memory_pool_enabled``.
* The encoder state (``StateArrays.enc``, float64) stays on the host: the shared numba
  encoder (:func:`~cerebellar_norse.neurons.encoder.encode_tick_to_mossy`) turns the
  ticks into mossy currents straight into a pinned staging buffer before the copy to
  the device, so tick-order checks and encoder snapshots always read current values.
* Host and device neuron state are reconciled by slot ownership. A slot the host has
  changed behind the backend's back (reset to rest for a new market, a restored
  snapshot: its encoder row differs from the one the backend last left, or it has
  seen no tick yet) is host-owned and is uploaded before its next tick; every other
  slot is device-owned and reaches the host only through :meth:`CudaBackend.sync_to_host`
  (called before snapshots and saves). :meth:`CudaBackend.sync_from_host` forces an
  upload.

Streams. ``streams`` CUDA streams each own pinned host and device staging buffers
for ``max_batch`` ticks (slots and mossy currents in; probabilities and spikes out).
Batches go round-robin over the streams. On its stream a batch is: copy-in (H2D),
wait for the previous batch's step (one event chains the steps, because batches
share the state slots), upload of host-owned slots, the step (eager or CUDA graph),
record of the chain event, copy-out (D2H), record of the stream's done event. So
the copy-in of batch k+1 and the copy-out of batch k-1 overlap the step of batch k,
while state updates stay in batch order. At most ``streams`` batches are in flight:
submitting to a stream whose previous batch was never waited for first collects that
batch (its results are kept in its handle).

Waves. A batch that repeats a market is staged in wave order (wave k = the k-th tick
of every market in the batch, see :func:`~cerebellar_norse.cuda.staging.wave_layout`);
each wave gathers its slots' states with ``index_select``, steps, and scatters them
back with ``index_copy_``, so a market's ticks apply in arrival order. A wave of more
ticks than :attr:`CudaBackend.launch_ticks` is stepped in several launches of at most
that many (:func:`~cerebellar_norse.cuda.staging.split_waves`).

CUDA graphs (``use_graphs=True``). A single-wave batch size seen ``graph_warmup``
times on a stream is captured once as a graph for that (stream, batch size) and
replayed from then on: the graph reads the stream's static staging buffers and the
resident state and weights, whose addresses never change (:meth:`set_weights` copies
new weights into the same tensors). A stream's graphs and its eager steps allocate
their intermediates in one ``torch.cuda.MemPool`` of the stream's own, the stream's
workspace: a stream runs one launch at a time and no intermediate outlives its launch,
so a capture reuses the memory of the eager steps before it and costs nothing beyond
the workspace charged at start (a graph holds at most ``launch_ticks`` ticks) except the
allocator's rounding, which is measured after each capture and charged as ``graphs.N``
(a graph the budget cannot take is dropped and its size stays eager). Where
torch has no ``MemPool`` (before 2.6), each graph gets a private pool charged to the
budget beside the workspace (estimated by
:func:`~cerebellar_norse.cuda.staging.workspace_bytes`); a graph the budget refuses is
not captured and that size stays eager.

Memory. Every allocation (pool, weights, staging, per-stream workspace estimates,
separate graph pools) is charged to a :class:`~cerebellar_norse.cuda.memory.MemoryBudget`
capped by ``performance.memory_limit`` before it is made. The workspaces come last and
are sized to what is left: ``launch_ticks`` is the most ticks per device launch whose
workspace fits every stream (the plan of :mod:`cerebellar_norse.cuda.plan`, which
``--validate-config`` prints); a limit without room for one tick per stream is a
:class:`~cerebellar_norse.errors.CapacityError` at start.

``device="cpu"`` runs the same code without streams, pinned memory or graphs (for
tests on hosts without a GPU); production on the CPU uses the fused backend.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from norse.torch.functional.leaky_integrator import LIState
from norse.torch.functional.lif import LIFFeedForwardState

from ..config import Config, fmt_bytes, fmt_bytes_at_least
from ..errors import (
    CapacityError,
    DeviceMemoryError,
    DeviceUnavailableError,
    EngineFatalError,
    host_shortage_reason,
    is_out_of_memory,
)
from ..neurons.backends import StagedBuffers
from ..neurons.encoder import S_N_TICKS
from ..neurons.functional import CerebellumState, CerebellumWeights, TickOutput, cerebellum_step
from ..neurons.parameters import NetworkParameters
from ..neurons.state import FLOAT_FIELDS, StateArrays
from ..neurons.topology import Weights
from .device import cuda_available
from .memory import DeviceMemory
from .plan import launch_ticks, weight_tensors
from .projections import SparseRows
from .staging import GraphPolicy, RoundRobin, encode_batch, split_waves, staging_layout, wave_layout, workspace_bytes

if TYPE_CHECKING:
    from ..engine.engine import Engine

log = logging.getLogger("cerebellar_norse.cuda")

# torch.cuda.MemPool lets a stream's eager steps and its CUDA graphs share one pool (torch >= 2.6).
SHARED_WORKSPACE = hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")

_TORCH_DTYPE = {np.dtype(np.int64): torch.int64, np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def device_tick(mossy: torch.Tensor, state: CerebellumState, w: CerebellumWeights,
                p: NetworkParameters) -> tuple[TickOutput, CerebellumState]:
    """:func:`~cerebellar_norse.neurons.functional.cerebellum_tick` with its spike accumulator on ``mossy``'s device.

    The same operations in the same order (the maths of a step is
    :func:`~cerebellar_norse.neurons.functional.cerebellum_step` itself); only the
    accumulator's ``torch.zeros`` names the device, which ``cerebellum_tick`` leaves to
    the default device. Args and result as for ``cerebellum_tick``.
    """
    mf_gr = mossy @ w.w_mg.T
    drive_dcn = mossy @ w.w_md.T + w.dcn_bias
    spikes = torch.zeros(mossy.shape[0], 3, dtype=mossy.dtype, device=mossy.device)
    v_out = state.readout.v
    for _ in range(p.steps_per_tick):
        v_out, z, state = cerebellum_step(mf_gr, drive_dcn, state, w, p)
        spikes = spikes + z
    return TickOutput(logits=p.readout_scale * v_out, spikes=spikes), state


class _HostEvent:
    """Stand-in for ``torch.cuda.Event`` on the CPU, where every copy is synchronous."""

    def record(self, stream: Any = None) -> None:
        """Nothing to record."""

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def query(self) -> bool:
        """Always complete."""
        return True


@dataclass
class CudaHandle:
    """A submitted batch; pass it to :meth:`CudaBackend.wait`.

    Attributes:
        seq: submission number (0, 1, …).
        lane: the stream index it runs on.
        size: ticks in the batch.
        perm: staging row -> batch position, or None when rows are in batch order.
        result: (probs, spikes) once collected.
    """

    seq: int
    lane: int
    size: int
    perm: np.ndarray | None
    result: tuple[np.ndarray, np.ndarray] | None = None


@dataclass
class _Lane:
    """One stream with its staging buffers and graphs."""

    index: int
    stream: Any  # torch.cuda.Stream, or None on the CPU
    done: Any  # torch.cuda.Event or _HostEvent: the lane's last copy-out finished
    slots_h: np.ndarray  # pinned host views (numpy) of the staging tensors
    mossy_h: np.ndarray
    probs_h: np.ndarray
    spikes_h: np.ndarray
    slots_ht: torch.Tensor  # the same buffers as tensors
    mossy_ht: torch.Tensor
    probs_ht: torch.Tensor
    spikes_ht: torch.Tensor
    slots_d: torch.Tensor  # device staging
    mossy_d: torch.Tensor
    probs_d: torch.Tensor
    spikes_d: torch.Tensor
    handle: CudaHandle | None = None
    graphs: dict[int, Any] = field(default_factory=dict)
    pool: Any = None  # torch.cuda.MemPool shared by the lane's eager steps and graphs (the stream's workspace), or None


class CudaBackend(StagedBuffers):
    """The network on a CUDA device (see the module docstring for the design).

    Args:
        weights: model weights (any float type; rounded to the network's).
        params: network parameters.
        state: the host slot arrays (encoder state lives here; neuron state is mirrored).
        enc_par: encoder parameters (:func:`~cerebellar_norse.neurons.parameters.encoder_parameters`).
        max_batch: most ticks per batch (``performance.batch_size``).
        streams: CUDA streams (``performance.cuda_streams``).
        memory_limit: hard cap on the backend's memory in bytes (``performance.memory_limit``).
        pool_size: bytes reserved at start for market states (``performance.memory_pool_size``).
        pool_enabled: reserve the pool (``performance.memory_pool_enabled``).
        device: ``"cuda"``, ``"cuda:N"``, or ``"cpu"`` (same code, no streams/graphs).
        use_graphs: capture CUDA graphs per (stream, batch size).
        graph_warmup: eager runs of a (stream, batch size) before its capture.
        max_graphs: most graphs kept.

    Attributes:
        launch_ticks: most ticks stepped in one device launch (see the module docstring).

    Raises:
        DeviceUnavailableError: a CUDA device was asked for and there is none.
        CapacityError: the allocations do not fit ``memory_limit`` or the pool.
    """

    name = "cuda"

    @property
    def warmup_rounds(self) -> int:
        """Warm-up repeats until every stream has captured its single-tick graph (graph warm-up + 1 runs per stream)."""
        return self.streams * (self.graph_policy.warmup + 1)

    def warmup_batch_sizes(self, max_batch: int) -> tuple[int, ...]:
        """The single-tick batch (whose graph serving reuses most)."""
        return (1,)

    def learning_views(self) -> None:
        """None: online learning updates host weights in place, which the device copy would not see."""
        return None

    def __init__(self, weights: Weights, params: NetworkParameters, state: StateArrays, enc_par: np.ndarray,
                 max_batch: int, *, streams: int = 1, memory_limit: int = 2_000_000_000, pool_size: int = 64_000_000,
                 pool_enabled: bool = True, device: str = "cuda", use_graphs: bool = True, graph_warmup: int = 2,
                 max_graphs: int = 64) -> None:
        self.device = torch.device(device)
        self.on_cuda = self.device.type == "cuda"
        if self.on_cuda and not cuda_available():
            raise DeviceUnavailableError(
                'performance.device = "cuda" but no CUDA device is available to the cuda backend; '
                'set performance.device = "cpu" (or "auto"), or run on a host with a GPU (check `nvidia-smi -L`)')
        if self.on_cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if self.on_cuda and torch.get_float32_matmul_precision() != "highest":
            log.warning("torch float32 matmul precision is %r: float32 results will drift from the reference "
                        "(set torch.set_float32_matmul_precision('highest'))", torch.get_float32_matmul_precision())
        self.params = params
        self.state = state
        self.enc_par = np.ascontiguousarray(enc_par, dtype=np.float64)
        self.max_batch = int(max_batch)
        self.dtype = params.dtype
        self.np_dtype = np.dtype(np.float32 if self.dtype == torch.float32 else np.float64)
        if state.flat.dtype != self.np_dtype:
            raise ValueError(f"state arrays are {state.flat.dtype}, the network is {self.np_dtype}")
        self._lock = threading.RLock()
        self._z = np.zeros(3, dtype=np.float64)
        self._arange = np.arange(self.max_batch, dtype=np.int64)
        self._allocate_buffers(self.max_batch, params.shape.classes)
        self._seq = 0
        self._closed = False
        self.graph_policy = GraphPolicy(use_graphs and self.on_cuda, graph_warmup, max_graphs)
        self._rr = RoundRobin(streams)
        self.mem = DeviceMemory(self.device, memory_limit, pool_size, pool_enabled, pin=self.on_cuda)
        try:
            self._allocate(streams)
            self.set_weights(weights)
            self.sync_from_host()
        except BaseException:
            self.mem.close()
            raise

    @classmethod
    def from_config(cls, cfg: Config, weights: Weights, params: NetworkParameters, state: StateArrays,
                    enc_par: np.ndarray, *, device: str = "cuda", use_graphs: bool = True) -> CudaBackend:
        """Build from the ``[performance]`` section: batch_size, cuda_streams, memory_pool_*, memory_limit."""
        perf = cfg.performance
        return cls(weights, params, state, enc_par, perf.batch_size, streams=perf.cuda_streams,
                   memory_limit=int(perf.memory_limit), pool_size=int(perf.memory_pool_size),
                   pool_enabled=perf.memory_pool_enabled, device=device, use_graphs=use_graphs)

    # -- allocation -------------------------------------------------------------

    def _allocate(self, streams: int) -> None:
        st, s = self.state, self.params.shape
        fb = self.np_dtype.itemsize
        # Resident state: one flat buffer in the host layout (in the pool when there is one).
        self._flat = self.mem.empty("state", (st.flat.size,), self.dtype, from_pool=True)
        base = st.flat.ctypes.data
        self._layout: dict[str, tuple[int, tuple[int, ...]]] = {}
        self._fields: dict[str, torch.Tensor] = {}
        for name in FLOAT_FIELDS:
            arr = getattr(st, name)
            off = (arr.ctypes.data - base) // fb
            self._layout[name] = (off, arr.shape)
            self._fields[name] = self._flat[off:off + arr.size].view(arr.shape)
        self._row_sizes = [int(np.prod(getattr(st, n).shape[1:])) for n in FLOAT_FIELDS]
        self._seen = st.enc.copy()  # encoder rows as the backend last left them (device ownership)
        self._scattered = 0  # waves of the batch being enqueued whose states were written back (eager steps)
        # Weights, allocated once (graphs keep their addresses): the sparse projections as gathers, the rest dense.
        self._wt = {name: self.mem.empty(f"weights.{name}", shp, torch.int64 if index else self.dtype)
                    for name, shp, index in weight_tensors(s)}
        wt = self._wt
        self._w = CerebellumWeights(
            w_mg=cast(torch.Tensor, SparseRows(wt["w_mg.idx"], wt["w_mg.val"])),  # used as mossy @ w_mg.T
            w_pf=cast(torch.Tensor, SparseRows(wt["w_pf.idx"], wt["w_pf.val"]).T),  # used as z_gr @ w_pf
            pc_bias=wt["pc_bias"], w_md=wt["w_md"], w_pd=wt["w_pd"], dcn_bias=wt["dcn_bias"], w_out=wt["w_out"])
        # Streams with their staging buffers; then the workspaces, sized to what is left (see cuda.plan).
        layout = staging_layout(self.max_batch, s, fb)
        self._lanes: list[_Lane] = []
        for i in range(streams):
            stream = torch.cuda.Stream(device=self.device, priority=-1) if self.on_cuda else None
            h = [self.mem.empty(f"staging.host.{i}.{nm}", shp, _TORCH_DTYPE[dt], host=True) for nm, shp, dt in layout.buffers()]
            d = [self.mem.empty(f"staging.device.{i}.{nm}", shp, _TORCH_DTYPE[dt]) for nm, shp, dt in layout.buffers()]
            for t in (*h, *d):
                t.zero_()
            done = torch.cuda.Event() if self.on_cuda else _HostEvent()
            pool = torch.cuda.MemPool() if self.graph_policy.enabled and SHARED_WORKSPACE else None
            self._lanes.append(_Lane(
                index=i, stream=stream, done=done,
                slots_h=h[0].numpy(), mossy_h=h[1].numpy(), probs_h=h[2].numpy(), spikes_h=h[3].numpy(),
                slots_ht=h[0], mossy_ht=h[1], probs_ht=h[2], spikes_ht=h[3],
                slots_d=d[0], mossy_d=d[1], probs_d=d[2], spikes_d=d[3], pool=pool))
        self.launch_ticks = launch_ticks(s, fb, self.max_batch, streams, self.mem.budget.available)
        if self.launch_ticks < 1:
            one, budget = workspace_bytes(s, 1, fb), self.mem.budget
            raise CapacityError(
                f"the step workspace of one tick, {fmt_bytes(one)} per stream x {streams} stream(s), does not fit "
                f"performance.memory_limit {fmt_bytes(budget.limit)} ({budget.limit} bytes) with {fmt_bytes(budget.used)} "
                f"in use ({budget.breakdown()}); raise memory_limit or lower memory_pool_size, cuda_streams or the network size",
                retry_after_s=0.0)
        self._workspace = workspace_bytes(s, self.launch_ticks, fb)
        for i in range(streams):
            self.mem.charge(f"workspace.{i}", self._workspace)
        self._chain: Any = torch.cuda.Event() if self.on_cuda else _HostEvent()
        fields = {"device": str(self.device), "streams": streams, "max_batch": self.max_batch,
                  "launch_ticks": self.launch_ticks, **self.mem.budget.report()}
        log.info("cuda backend ready", extra={"fields": fields})
        if self.launch_ticks < self.max_batch:
            log.warning("cuda: performance.memory_limit leaves room for device launches of up to %d of batch_size %d ticks "
                        "per stream, so a full batch takes %d launches; raise memory_limit (%s for one launch) or lower "
                        "cuda_streams, batch_size or the network size", self.launch_ticks, self.max_batch,
                        -(-self.max_batch // self.launch_ticks),
                        fmt_bytes_at_least(self.mem.used + streams * (workspace_bytes(s, self.max_batch, fb)
                                                             - workspace_bytes(s, self.launch_ticks, fb))),
                        extra={"fields": fields})

    def _weights_host(self, weights: Weights) -> dict[str, np.ndarray]:
        """The host arrays of :func:`~cerebellar_norse.cuda.plan.weight_tensors` (network float type, int64 indices)."""
        w = weights.astype(self.np_dtype)
        idx = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
        return {"w_mg.idx": idx(w.mg_idx), "w_mg.val": w.mg_w, "w_pf.idx": idx(w.pf_pre), "w_pf.val": w.pf_w,
                "pc_bias": w.pc_bias, "w_md": w.w_md, "w_pd": w.w_pd, "dcn_bias": w.dcn_bias, "w_out": w.w_out}

    # -- properties ---------------------------------------------------------------

    @property
    def streams(self) -> int:
        """Number of streams."""
        return len(self._lanes)

    @property
    def memory_used_bytes(self) -> int:
        """Bytes charged to the budget (pool reservation included)."""
        return self.mem.used

    @property
    def memory_limit_bytes(self) -> int:
        """The budget's cap (``performance.memory_limit``)."""
        return self.mem.total

    def memory_report(self) -> dict[str, int]:
        """Budget figures (limit, used, pool, device and pinned host bytes)."""
        return self.mem.budget.report()

    # -- weights ------------------------------------------------------------------

    def set_weights(self, weights: Weights) -> None:
        """Swap in new weights (same topology) between batches.

        Batches in flight finish with the weights they started with; the new values
        are copied into the same device tensors, so captured graphs stay valid.
        """
        host = self._weights_host(weights)
        with self._lock, torch.no_grad():
            for name, dst in self._wt.items():
                if tuple(host[name].shape) != tuple(dst.shape):
                    raise ValueError(f"weights {name} of shape {tuple(host[name].shape)} do not match the network's "
                                     f"{tuple(dst.shape)}")
            self._synchronize_locked()
            for name, dst in self._wt.items():
                dst.copy_(torch.from_numpy(host[name]))
            if self.on_cuda:
                torch.cuda.synchronize(self.device)

    # -- host <-> device state ----------------------------------------------------

    def _host_owned(self, slots: np.ndarray) -> np.ndarray:
        """Of ``slots``, those whose host state is authoritative (reset, restored, or never ticked)."""
        enc = self.state.enc[slots]
        mask = (enc[:, S_N_TICKS] == 0.0) | (enc != self._seen[slots]).any(axis=1)
        return np.unique(slots[mask]) if mask.any() else slots[:0]

    def _by_launch(self, slots: np.ndarray) -> Iterator[np.ndarray]:
        """``slots`` in pieces of at most ``launch_ticks``: a transfer of their rows is transient device memory the
        step workspace covers (the gathered state of a launch), where all of a batch's new markets at once would
        overrun ``memory_limit``."""
        for k in range(0, int(slots.size), self.launch_ticks):
            yield slots[k:k + self.launch_ticks]

    def _upload_rows(self, slots: np.ndarray) -> None:
        """Copy the host neuron state of ``slots`` to the device (on the current stream), a launch's worth at a time."""
        for piece in self._by_launch(slots):
            self._upload_piece(piece)

    def _upload_piece(self, slots: np.ndarray) -> None:
        st = self.state
        rows = np.concatenate([getattr(st, n)[slots].reshape(slots.size, -1) for n in FLOAT_FIELDS], axis=1)
        src = torch.from_numpy(rows)
        idx = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64))
        if self.on_cuda:
            src, idx = src.pin_memory(), idx.pin_memory()
        src = src.to(self.device, non_blocking=True)
        idx = idx.to(self.device, non_blocking=True)
        col = 0
        for name, width in zip(FLOAT_FIELDS, self._row_sizes, strict=True):
            dst = self._fields[name]
            dst.index_copy_(0, idx, src[:, col:col + width].reshape((slots.size, *dst.shape[1:])))
            col += width
        self._seen[slots] = st.enc[slots]

    def sync_from_host(self, slots: np.ndarray | list[int] | None = None) -> None:
        """Upload the host neuron state of ``slots`` (default: every slot); waits for batches in flight.

        Slots the host reset or restored are picked up on their next tick anyway; this
        forces it (e.g. after writing many slots at once).
        """
        with self._lock, torch.no_grad():
            self._synchronize_locked()
            if slots is None:
                self._flat.copy_(torch.from_numpy(self.state.flat))
                self._seen[:] = self.state.enc
            else:
                s = np.unique(np.asarray(slots, dtype=np.int64))
                if s.size:
                    self._upload_rows(s)
            if self.on_cuda:
                torch.cuda.synchronize(self.device)

    def sync_to_host(self, slots: Sequence[int] | np.ndarray | None = None) -> int:
        """Bring the device state of ``slots`` (default: all) into the host StateArrays.

        Waits for batches in flight. Host-owned slots (reset or restored on the host
        and not stepped since) keep their host values. Returns the slots copied.
        """
        with self._lock, torch.no_grad():
            self._synchronize_locked()
            cand = np.arange(self.state.slots, dtype=np.int64) if slots is None else np.unique(np.asarray(slots, dtype=np.int64))
            if cand.size == 0:
                return 0
            owned = np.setdiff1d(cand, self._host_owned(cand), assume_unique=True)
            if owned.size == 0:
                return 0
            st = self.state
            if 4 * owned.size >= st.slots:  # most of the state: one copy of the whole buffer
                host = self._flat.cpu().numpy()
                for name in FLOAT_FIELDS:
                    off, shape = self._layout[name]
                    view = host[off:off + int(np.prod(shape))].reshape(shape)
                    getattr(st, name)[owned] = view[owned]
            else:  # a few slots: gather their rows on the device, a launch's worth at a time
                for part in self._by_launch(owned):
                    idx = torch.from_numpy(part).to(self.device)
                    for name in FLOAT_FIELDS:
                        getattr(st, name)[part] = self._fields[name].index_select(0, idx).cpu().numpy()
            return int(owned.size)

    # -- stepping -------------------------------------------------------------------

    def _stream_ctx(self, lane: _Lane) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(lane.stream) if lane.stream is not None else contextlib.nullcontext()

    def _workspace_ctx(self, lane: _Lane) -> contextlib.AbstractContextManager[Any]:
        """Eager steps allocate their intermediates in the lane's shared pool, where its graphs live too."""
        return torch.cuda.use_mem_pool(lane.pool, device=self.device) if lane.pool is not None else contextlib.nullcontext()

    def _compute(self, lane: _Lane, bounds: list[tuple[int, int]]) -> None:
        """Step the staged batch wave by wave: gather, tick, scatter, outputs into the lane's buffers."""
        f, w, p = self._fields, self._w, self.params
        for a, e in bounds:
            idx = lane.slots_d[a:e]

            def sel(t: torch.Tensor, idx: torch.Tensor = idx) -> torch.Tensor:
                return t.index_select(0, idx)

            state = CerebellumState(
                granule=LIFFeedForwardState(v=sel(f["v_gr"]), i=sel(f["i_gr"])),
                golgi=sel(f["golgi"]).unsqueeze(1),
                purkinje=LIFFeedForwardState(v=sel(f["v_pc"]), i=sel(f["i_pc"])),
                dcn=LIFFeedForwardState(v=sel(f["v_dcn"]), i=sel(f["i_dcn"])),
                readout=LIState(v=sel(f["v_out"]), i=sel(f["i_out"])),
            )
            out, new = device_tick(lane.mossy_d[a:e], state, w, p)
            # every allocation of the wave comes before its scatter: a wave the device has no memory for changes no
            # state (the batch can be tried again, see submit)
            probs = torch.softmax(out.logits.double(), dim=1)
            spikes = out.spikes.round().long()
            self._scattered += 1
            f["v_gr"].index_copy_(0, idx, new.granule.v)
            f["i_gr"].index_copy_(0, idx, new.granule.i)
            f["golgi"].index_copy_(0, idx, new.golgi.squeeze(1))
            f["v_pc"].index_copy_(0, idx, new.purkinje.v)
            f["i_pc"].index_copy_(0, idx, new.purkinje.i)
            f["v_dcn"].index_copy_(0, idx, new.dcn.v)
            f["i_dcn"].index_copy_(0, idx, new.dcn.i)
            f["v_out"].index_copy_(0, idx, new.readout.v)
            f["i_out"].index_copy_(0, idx, new.readout.i)
            lane.probs_d[a:e].copy_(probs)
            lane.spikes_d[a:e].copy_(spikes)

    def _capture(self, lane: _Lane, b: int) -> bool:
        """Capture the single-wave step of ``b`` ticks on ``lane``; False when refused or failed."""
        key = (lane.index, b)
        name = f"graphs.{lane.index}.{b}"
        if lane.pool is None:  # a private pool of its own, charged beside the workspace
            try:
                self.mem.charge(name, workspace_bytes(self.params.shape, b, self.np_dtype.itemsize))
            except CapacityError as exc:
                log.info("cuda graph not captured: %s", exc)
                self.graph_policy.record_refused(key)
                return False
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=lane.pool.id if lane.pool is not None else None, stream=lane.stream,
                                  capture_error_mode="thread_local"):
                self._compute(lane, [(0, b)])
        except RuntimeError as exc:
            if lane.pool is None:
                self.mem.release(name)
            self.graph_policy.record_refused(key)
            log.warning("cuda graph capture of batch %d on stream %d failed, running eagerly: %s", b, lane.index, exc)
            return False
        lane.graphs[b] = graph
        if lane.pool is not None and not self._charge_pool_rounding(lane):
            del lane.graphs[b]
            self.graph_policy.record_refused(key)
            return False
        self.graph_policy.record_captured(key)
        return True

    def _charge_pool_rounding(self, lane: _Lane) -> bool:
        """Charge what the lane's shared pool holds beyond its workspace (``graphs.N``); False when the budget refuses.

        The caching allocator carves a pool into segments (rounded to 2 MiB, small blocks
        out of 2 and 20 MiB segments) and splits them between the sizes it has served,
        so a pool that has held several launch sizes can reserve a few percent more than
        the largest step needs. Measured here, after a capture, rather than estimated.
        """
        name = f"graphs.{lane.index}"
        over = sum(int(seg["total_size"]) for seg in torch.cuda.memory_snapshot(lane.pool.id)) - self._workspace
        held = self.mem.budget.items().get(name)
        if over <= (held.nbytes if held is not None else 0):
            return True
        if held is not None:
            self.mem.release(name)
        try:
            self.mem.charge(name, over)
        except CapacityError as exc:
            if held is not None:
                self.mem.charge(name, held.nbytes)
            log.info("cuda graph of stream %d not kept: its pool holds %s beyond the workspace: %s",
                     lane.index, fmt_bytes(over), exc)
            return False
        return True

    def submit(self, slots: np.ndarray, ticks: np.ndarray) -> CudaHandle:
        """Encode a batch on the host and enqueue it on the next stream; returns at once.

        ``slots`` (B,) int64, ``ticks`` (3, B) float64 rows price, volume, time (ms);
        ticks of one market in arrival order. Submissions are applied in order.
        """
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        ticks = np.ascontiguousarray(ticks, dtype=np.float64)
        b = int(slots.shape[0])
        if b > self.max_batch:
            raise ValueError(f"batch of {b} exceeds the staging buffers of {self.max_batch}")
        if ticks.shape != (3, b):
            raise ValueError(f"ticks must have shape (3, {b}), got {ticks.shape}")
        with self._lock:
            if self._closed:
                raise EngineFatalError("the cuda backend is closed")
            seq = self._seq
            self._seq += 1
            if b == 0:
                k = self.params.shape.classes
                return CudaHandle(seq, -1, 0, None, (np.empty((0, k)), np.empty((0, 3), dtype=np.int64)))
            lane = self._lanes[self._rr.next()]
            if lane.handle is not None:
                self._collect(lane.handle, copy=True)  # its buffers are about to be reused
            perm, waves = wave_layout(slots)
            bounds = split_waves(waves, self.launch_ticks)
            order = perm if perm is not None else self._arange[:b]
            stale = self._host_owned(slots)
            enc_before = self.state.enc[slots]
            seen_before = self._seen[slots]
            encode_batch(order, slots, ticks, self.state.enc, self.enc_par, self._z, lane.slots_h, lane.mossy_h)
            self._seen[slots] = self.state.enc[slots]
            self._scattered = 0
            try:
                self._enqueue(lane, b, bounds, stale)
            except BaseException as exc:
                # Nothing of this batch reached the state: put the encoder rows back.
                self.state.enc[slots] = enc_before
                self._seen[slots] = seen_before
                if is_out_of_memory(exc) and self._scattered == 0:  # no memory before any wave changed a state
                    raise DeviceMemoryError(
                        f"the GPU ran out of memory stepping a batch of {b} tick(s) on {self.device} "
                        f"({host_shortage_reason(exc)}); nothing of the batch was applied: another process may hold "
                        "the GPU's memory (nvidia-smi); try again") from None
                applied_in_part = isinstance(exc, CapacityError) and self._scattered  # (a refusal says: not applied)
                if (isinstance(exc, RuntimeError) and not isinstance(exc, CapacityError)) or applied_in_part:
                    raise EngineFatalError(f"cuda backend: step failed on {self.device}: {exc}") from exc
                raise
            handle = CudaHandle(seq, lane.index, b, perm)
            lane.handle = handle
            return handle

    def _enqueue(self, lane: _Lane, b: int, bounds: list[tuple[int, int]], stale: np.ndarray) -> None:
        with torch.no_grad(), self._stream_ctx(lane):
            lane.slots_d[:b].copy_(lane.slots_ht[:b], non_blocking=True)
            lane.mossy_d[:b].copy_(lane.mossy_ht[:b], non_blocking=True)
            if lane.stream is not None:
                lane.stream.wait_event(self._chain)  # state updates stay in batch order
            if stale.size:
                self._upload_rows(stale)
            action = self.graph_policy.decide((lane.index, b), eligible=len(bounds) == 1)
            if action == "capture":
                captured = self._capture(lane, b)
                self._scattered = 0  # a capture records the step and runs nothing
                if captured:
                    action = "replay"
            if action == "replay":
                lane.graphs[b].replay()
            else:
                with self._workspace_ctx(lane):
                    self._compute(lane, bounds)
            self._chain.record(lane.stream)
            lane.probs_ht[:b].copy_(lane.probs_d[:b], non_blocking=True)
            lane.spikes_ht[:b].copy_(lane.spikes_d[:b], non_blocking=True)
            lane.done.record(lane.stream)

    def _collect(self, handle: CudaHandle, copy: bool) -> tuple[np.ndarray, np.ndarray]:
        """Wait for ``handle``'s copy-out; results in batch order (views of the staging buffers unless ``copy``)."""
        lane = self._lanes[handle.lane]
        try:
            lane.done.synchronize()
        except RuntimeError as exc:
            raise EngineFatalError(f"cuda backend: device failure on {self.device}: {exc}") from exc
        n = handle.size
        probs, spikes = lane.probs_h[:n], lane.spikes_h[:n]
        if handle.perm is not None:
            p, s = np.empty_like(probs), np.empty_like(spikes)
            p[handle.perm], s[handle.perm] = probs, spikes
            probs, spikes = p, s
        elif copy:
            probs, spikes = probs.copy(), spikes.copy()
        handle.result = (probs, spikes)
        lane.handle = None
        return handle.result

    def wait(self, handle: CudaHandle) -> tuple[np.ndarray, np.ndarray]:
        """Results of a submitted batch: probs (B, K) float64, spikes (B, 3) int64, in batch order.

        The arrays may be views of the stream's staging buffers, valid until that
        stream takes another batch (``streams`` submissions later).
        """
        with self._lock:
            if handle.result is not None:
                return handle.result
            return self._collect(handle, copy=False)

    def step(self, slots: np.ndarray, ticks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Apply ticks (in order) to the given slots: :meth:`submit` then :meth:`wait`."""
        return self.wait(self.submit(slots, ticks))

    # -- lifecycle ----------------------------------------------------------------------

    def _synchronize_locked(self) -> None:
        for lane in self._lanes:
            if lane.handle is not None:
                self._collect(lane.handle, copy=True)
        if self.on_cuda:
            for lane in self._lanes:
                lane.done.synchronize()

    def synchronize(self) -> None:
        """Wait for every batch in flight (their results stay in their handles)."""
        with self._lock:
            self._synchronize_locked()

    def release_graphs(self) -> None:
        """Drop every captured graph and its budget charge (sizes are captured again when they recur)."""
        with self._lock:
            self._synchronize_locked()
            for lane in self._lanes:
                for b in list(lane.graphs):
                    del lane.graphs[b]
                    if lane.pool is None:
                        self.mem.release(f"graphs.{lane.index}.{b}")
                # a shared pool keeps its segments (and their charge, graphs.N) for the eager steps and later captures
            self.graph_policy.forget()

    def close(self) -> None:
        """Copy the device state to the host, then free every device buffer."""
        with self._lock:
            if self._closed:
                return
            self.sync_to_host()
            self.release_graphs()
            self._lanes.clear()
            self._fields.clear()
            del self._flat, self._w, self._wt
            self._closed = True
            self.mem.close()
            log.info("cuda backend closed", extra={"fields": {"device": str(self.device)}})

    def describe(self) -> dict[str, Any]:
        """Device, streams, graphs and memory figures (for health and debug bundles)."""
        rep = self.memory_report()
        return {
            "backend": self.name,
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device) if self.on_cuda else "cpu",
            "streams": self.streams,
            "max_batch": self.max_batch,
            "launch_ticks": self.launch_ticks,
            "graphs": sorted(self.graph_policy.captured, key=str),
            "memory": {k: fmt_bytes(v) for k, v in rep.items()},
        }


def make_cuda_engine(cfg: Config, weights: Weights | None = None, model_version: str = "", *, device: str = "cuda",
                     use_graphs: bool = True) -> Engine:
    """The service engine with a :class:`CudaBackend` over its slot arrays (``performance.device`` resolved to cuda)."""
    from ..engine.engine import Engine

    return Engine(cfg, weights, model_version, backend="cuda", backend_options={"device": device, "use_graphs": use_graphs})


__all__ = ["CudaBackend", "CudaHandle", "device_tick", "make_cuda_engine"]
