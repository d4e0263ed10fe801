"""Backends: one interface, :class:`Backend`, whose ``step(slots, ticks) -> (probs, spikes)`` runs the network.

Every backend updates the same slot arrays (:class:`StateArrays`) in place (the CUDA
backend mirrors them on the device and syncs on demand), so they are interchangeable
and directly comparable. What else the engine needs (online-learning views, warm-up
batch sizes, host/device sync, a description for /health, the fused kernel's arguments
for a step in one compiled call) is part of the Protocol, so the engine never probes a
backend for attributes.

* ``fused``: the numba kernel of :mod:`.fused` (CPU fast path).
* ``reference``: the Norse reference module, batched in torch.
* ``cuda``: :class:`cerebellar_norse.cuda.backend.CudaBackend` (streams, CUDA graphs).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numba as nb
import numpy as np
import torch
from norse.torch.functional.leaky_integrator import LIState
from norse.torch.functional.lif import LIFFeedForwardState

from .encoder import encode_tick_to_mossy
from .functional import CerebellumState
from .fused import (
    FusedWorkspace,
    PackedWeights,
    chunk_by_slot,
    make_dims,
    tick_batch,
    tick_batch_parallel,
    tick_batch_table,
)
from .native import ArgTable, compiled_entry
from .parameters import NetworkParameters, encoder_parameters, kernel_coefficients, numpy_dtype
from .reference import CerebellarReference
from .state import StateArrays
from .topology import Weights

BACKENDS = ("fused", "reference", "cuda")


@dataclass(frozen=True)
class LearningViews:
    """Live views of the weights that climbing-fibre learning changes in place, and the last step's granule activity.

    ``pf_w``/``pf_ptr``/``pf_post``: the parallel-fibre weights in CSR order, row
    pointers and Purkinje cells; ``pf_rows`` the dense rows (G, P) the kernel reads
    instead when the network is small enough (else (0, P)); ``active`` (max_batch, G)
    uint8 flags of the granule cells that spiked during each tick of the last step.
    """

    pf_w: np.ndarray
    pf_ptr: np.ndarray
    pf_post: np.ndarray
    pf_rows: np.ndarray
    active: np.ndarray


@dataclass(frozen=True, slots=True)
class FusedStep:
    """The fused kernel's staged step as arguments of :func:`.fused.tick_batch_table`, for a caller that runs it and
    passes of its own in one compiled call (the engine's finishing pass: one call into compiled code per step, not two).

    ``table``, ``steps`` and ``fzero`` are the kernel's arguments beside the batch size ``b``; the step of ``b`` ticks
    is what :meth:`Backend.step_buffered` (b) runs for every ``b < threaded_from`` (larger batches are split over
    threads), and ``outputs[b]`` are its probabilities and spikes, views of the output buffers.
    """

    table: ArgTable
    steps: int
    fzero: np.floating[Any]
    threaded_from: int
    outputs: list[tuple[np.ndarray, np.ndarray]]


class Backend(Protocol):
    """What the engine needs from a backend."""

    name: str

    @property
    def warmup_rounds(self) -> int:
        """Times the engine's warm-up runs its scratch batches (CUDA graphs are captured on repeats)."""
        ...

    def step(self, slots: np.ndarray, ticks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Apply ticks (in order) to the given slots.

        ``slots`` is (B,) int64, ``ticks`` (3, B) float64 rows price, volume, time (ms).

        Returns views valid until the next call: probabilities (B, K) float64 and
        spikes per population (B, 3) int64.
        """
        ...

    def input_buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """The backend's own input buffers: slots (max_batch,) int64 and ticks (3, max_batch) float64.

        Filling their first B entries and calling :meth:`step_buffered` (B) is
        :meth:`step` of those entries, without handing arrays over on every call.
        """
        ...

    def output_buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """The backend's own output buffers: probabilities (max_batch, K) float64 and spikes (max_batch, 3) int64.

        :meth:`step_buffered` (B) returns their first B rows.
        """
        ...

    def step_buffered(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`step` of the first ``b`` entries of :meth:`input_buffers`, into :meth:`output_buffers`."""
        ...

    def set_weights(self, weights: Weights) -> None:
        """Swap in new weights (same topology) between batches."""
        ...

    def fused_step(self) -> FusedStep | None:
        """The staged step as the fused kernel's arguments (see :class:`FusedStep`), or None where
        :meth:`step_buffered` runs anything else; read it once per step (``set_weights`` replaces it)."""
        ...

    def warmup_batch_sizes(self, max_batch: int) -> tuple[int, ...]:
        """Batch sizes whose compiled variants the engine's warm-up should run once (each ≤ ``max_batch``)."""
        ...

    def learning_views(self) -> LearningViews | None:
        """Views for online (climbing-fibre) learning, or None where this backend cannot learn online."""
        ...

    def sync_to_host(self, slots: Sequence[int] | np.ndarray | None = None) -> int:
        """Make the host slot arrays of ``slots`` (default: all) current; returns the slots copied (0 where the
        host arrays are the state itself)."""
        ...

    def sync_from_host(self) -> None:
        """Push host slot arrays changed outside the backend (restore, import) to where the backend keeps state."""
        ...

    def describe(self) -> dict[str, Any] | None:
        """The backend's figures for /health under its name (device, streams, memory), or None."""
        ...

    def close(self) -> None:
        """Release what the backend holds (device memory); the host state stays current."""
        ...


class StagedBuffers:
    """The input and output buffers a backend owns, and :meth:`step_buffered` through its :meth:`step`."""

    _inputs: tuple[np.ndarray, np.ndarray]
    _outputs: tuple[np.ndarray, np.ndarray]

    def step(self, slots: np.ndarray, ticks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Apply ticks (in order) to the given slots (see :class:`Backend`)."""
        raise NotImplementedError

    def _allocate_buffers(self, max_batch: int, classes: int,
                          outputs: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Input buffers for ``max_batch`` ticks; ``outputs`` (probs, spikes), or new ones of ``classes`` classes."""
        self._inputs = np.zeros(max_batch, dtype=np.int64), np.zeros((3, max_batch), dtype=np.float64)
        self._outputs = outputs if outputs is not None else (np.zeros((max_batch, classes)),
                                                             np.zeros((max_batch, 3), dtype=np.int64))

    def input_buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """The staged input buffers (see :class:`Backend`)."""
        return self._inputs

    def fused_step(self) -> FusedStep | None:
        """None: :meth:`step_buffered` runs :meth:`step` (see :class:`Backend`)."""
        return None

    def output_buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """The output buffers (see :class:`Backend`)."""
        return self._outputs

    def step_buffered(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`step` of the first ``b`` staged ticks, its results copied into the output buffers unless
        :meth:`step` already wrote them there."""
        probs, spikes = self.step(self._inputs[0][:b], self._inputs[1][:, :b])
        out_p, out_s = self._outputs
        if probs.base is not out_p:
            out_p[:b] = probs
        if spikes.base is not out_s:
            out_s[:b] = spikes
        return out_p[:b], out_s[:b]


class HostBackend(StagedBuffers):
    """Defaults of a backend whose state is the host slot arrays themselves."""

    warmup_rounds = 1
    max_batch: int

    def warmup_batch_sizes(self, max_batch: int) -> tuple[int, ...]:
        """One single-tick batch."""
        return (1,)

    def learning_views(self) -> LearningViews | None:
        """None: no online learning."""
        return None

    def sync_to_host(self, slots: Sequence[int] | np.ndarray | None = None) -> int:
        """Nothing to sync: the host arrays are the state."""
        return 0

    def sync_from_host(self) -> None:
        """Nothing to sync."""

    def describe(self) -> dict[str, Any] | None:
        """Nothing beyond the engine's figures."""
        return None

    def close(self) -> None:
        """Nothing to release."""


class FusedBackend(HostBackend):
    """The numba kernel over preallocated buffers; batches up to ``max_batch`` ticks.

    With ``threads > 1``, batches of at least ``parallel_min_batch`` ticks are split by
    market over that many threads (a market's ticks stay on one thread, in order);
    smaller batches run on the calling thread, where a thread hand-off would cost
    more than it saves.
    """

    name = "fused"

    def __init__(self, weights: Weights, params: NetworkParameters, state: StateArrays, enc_par: np.ndarray,
                 max_batch: int, threads: int = 1, parallel_min_batch: int = 32) -> None:
        self.params = params
        self.state = state
        self.enc_par = enc_par
        self.coef = kernel_coefficients(params)
        self.max_batch = max_batch
        self.threads = max(1, min(threads, nb.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
        self.parallel_min_batch = parallel_min_batch
        self.ws = FusedWorkspace.allocate(params.shape, self.coef.dtype, max_batch, self.threads)
        self.dims = make_dims(params.shape, state.slots)
        self._allocate_buffers(max_batch, params.shape.classes, (self.ws.probs, self.ws.spikes))
        self._fzero = self.coef.dtype.type(0)
        self._steps = params.steps_per_tick
        self._entry: Any = None  # tick_batch_table's compiled variant, resolved on the first staged step
        self._views = [(self.ws.probs[:b], self.ws.spikes[:b]) for b in range(max_batch + 1)]
        self.set_weights(weights)

    def set_weights(self, weights: Weights) -> None:
        """Swap weights; a running step keeps the set it started with."""
        packed = PackedWeights.pack(weights, self.coef.dtype)
        table = self._arg_table(packed)
        threaded_from = self.parallel_min_batch if self.threads > 1 else self.max_batch + 1
        self.packed, self._fused = packed, FusedStep(table, self._steps, self._fzero, threaded_from, self._views)

    def fused_step(self) -> FusedStep:
        """The staged step as :func:`.fused.tick_batch_table`'s arguments (see :class:`Backend`)."""
        return self._fused

    def _arg_table(self, pw: PackedWeights) -> ArgTable:
        """The kernel's arguments for staged steps with weights ``pw`` (order of ``layout.TABLE_ARGS``)."""
        ws, st = self.ws, self.state
        slots, ticks = self._inputs
        return ArgTable((slots, ticks, st.flat, st.enc, pw.wf, pw.wi, self.dims, self.coef, self.enc_par,
                         ws.work_f[0], ws.work_i[0], ws.work_z[0], ws.probs, ws.spikes, ws.active))

    def warmup_batch_sizes(self, max_batch: int) -> tuple[int, ...]:
        """One tick, and with threads the smallest batch that runs in parallel."""
        if self.threads > 1:
            return tuple(sorted({1, min(max_batch, max(self.parallel_min_batch, 1))}))
        return (1,)

    def learning_views(self) -> LearningViews:
        """Live views of the parallel-fibre weights in the packed arrays and of the last step's granule flags."""
        return LearningViews(*self.pf_views(), self.ws.active)

    def pf_views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Live views of the parallel-fibre weights in the packed arrays.

        Returns the CSR weights, row pointers and Purkinje cells, and the dense rows
        (G, P) the kernel reads instead when the network is small enough (else (0, P)).
        """
        pw = self.packed
        return pw.floats("pf_w"), pw.ints("pf_ptr"), pw.ints("pf_post"), pw.floats("pf_rows")

    def active_granules(self, b: int) -> np.ndarray:
        """Granule cells that spiked during the ``b``-th tick of the last step (uint8 flags, a view)."""
        return self.ws.active[b]

    def step(self, slots: np.ndarray, ticks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run the fused kernel for one batch (one caller at a time: the workspace is shared)."""
        b = slots.shape[0]
        if b > self.max_batch:
            raise ValueError(f"batch of {b} exceeds the workspace of {self.max_batch}")
        ws, pw = self.ws, self.packed  # one read of the weights: a concurrent set_weights swaps whole
        if b >= self._fused.threaded_from:
            order, starts = chunk_by_slot(slots, self.threads)
            nb.set_num_threads(self.threads)
            tick_batch_parallel(order, starts, slots, ticks, self.state.flat, self.state.enc, pw.wf, pw.wi, self.dims,
                                self.coef, self.enc_par, self.params.steps_per_tick, ws.work_f, ws.work_i, ws.work_z,
                                ws.probs, ws.spikes, ws.active)
        else:
            tick_batch(slots, ticks, self.state.flat, self.state.enc, pw.wf, pw.wi, self.dims, self.coef, self.enc_par,
                       self.params.steps_per_tick, ws.work_f[0], ws.work_i[0], ws.work_z[0], ws.probs, ws.spikes, ws.active)
        return self._views[b]

    def step_buffered(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`step` of the first ``b`` staged ticks; one integer hands the kernel all its arrays."""
        if not 0 <= b <= self.max_batch:
            raise ValueError(f"batch of {b} is outside the workspace of {self.max_batch}")
        fused = self._fused  # one read: a concurrent set_weights swaps whole tables, and this keeps ours alive
        if b >= fused.threaded_from:
            return super().step_buffered(b)
        table = fused.table
        entry = self._entry
        if entry is None:
            entry = self._entry = compiled_entry(tick_batch_table, table.address, table.size, b, fused.steps, fused.fzero)
        entry(table.address, table.size, b, fused.steps, fused.fzero)
        return fused.outputs[b]


def unique_waves(slots: np.ndarray) -> list[np.ndarray]:
    """Split batch positions into consecutive waves in which each slot occurs at most once.

    Wave k holds the k-th occurrence of every slot, so applying the waves in order
    applies each market's ticks in arrival order.
    """
    seen: dict[int, int] = {}
    rank = np.empty(slots.shape[0], dtype=np.int64)
    for j, s in enumerate(slots.tolist()):
        rank[j] = seen.get(s, 0)
        seen[s] = rank[j] + 1
    return [np.nonzero(rank == k)[0] for k in range(int(rank.max()) + 1 if rank.size else 0)]


class ReferenceBackend(HostBackend):
    """The Norse reference network, batched in torch (no gradients)."""

    name = "reference"

    def __init__(self, weights: Weights, params: NetworkParameters, state: StateArrays, enc_par: np.ndarray,
                 max_batch: int) -> None:
        self.params = params
        self.state = state
        self.enc_par = enc_par
        self.dtype = numpy_dtype("float32" if params.dtype == torch.float32 else "float64")
        self.max_batch = max_batch
        self._allocate_buffers(max_batch, params.shape.classes)
        self._z = np.zeros(3, dtype=np.float64)
        self._lock = threading.Lock()
        self.set_weights(weights)

    def set_weights(self, weights: Weights) -> None:
        """Rebuild the module from ``weights``."""
        module = CerebellarReference(weights.astype(self.dtype), self.params).eval()
        with torch.no_grad():
            dense = module.dense_weights()
        with self._lock:
            self.module, self._dense = module, dense

    def step(self, slots: np.ndarray, ticks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Encode (shared numba encoder) and step the reference, one wave of distinct markets at a time."""
        b = slots.shape[0]
        probs = np.empty((b, self.params.shape.classes), dtype=np.float64)
        spikes = np.empty((b, 3), dtype=np.int64)
        st = self.state
        with self._lock, torch.no_grad():
            for wave in unique_waves(slots):
                ws = slots[wave]
                mossy = np.empty((wave.size, self.params.shape.mossy), dtype=self.dtype)
                for j, pos in enumerate(wave.tolist()):
                    encode_tick_to_mossy(st.enc[slots[pos]], ticks[0, pos], ticks[1, pos], ticks[2, pos], self.enc_par, self._z, mossy[j])
                t = lambda a, ws=ws: torch.from_numpy(a[ws])  # noqa: E731
                state = CerebellumState(
                    granule=LIFFeedForwardState(v=t(st.v_gr), i=t(st.i_gr)),
                    golgi=torch.from_numpy(st.golgi[ws]).unsqueeze(1),
                    purkinje=LIFFeedForwardState(v=t(st.v_pc), i=t(st.i_pc)),
                    dcn=LIFFeedForwardState(v=t(st.v_dcn), i=t(st.i_dcn)),
                    readout=LIState(v=t(st.v_out), i=t(st.i_out)),
                )
                out, new = self.module(torch.from_numpy(mossy), state, self._dense)
                st.v_gr[ws], st.i_gr[ws] = new.granule.v.numpy(), new.granule.i.numpy()
                st.golgi[ws] = new.golgi.squeeze(1).numpy()
                st.v_pc[ws], st.i_pc[ws] = new.purkinje.v.numpy(), new.purkinje.i.numpy()
                st.v_dcn[ws], st.i_dcn[ws] = new.dcn.v.numpy(), new.dcn.i.numpy()
                st.v_out[ws], st.i_out[ws] = new.readout.v.numpy(), new.readout.i.numpy()
                probs[wave] = torch.softmax(out.logits.double(), dim=1).numpy()
                spikes[wave] = out.spikes.round().long().numpy()
        return probs, spikes


def make_backend(name: str, weights: Weights, params: NetworkParameters, state: StateArrays, enc_par: np.ndarray,
                 max_batch: int, threads: int = 1, cuda_options: dict[str, Any] | None = None) -> Backend:
    """Build a backend by name (``fused``, ``reference`` or ``cuda``) over the slot arrays ``state``.

    ``threads`` applies to fused; ``cuda_options`` are passed to
    :meth:`CudaBackend.from_config <cerebellar_norse.cuda.backend.CudaBackend.from_config>`
    (``cfg`` required; ``device``, ``use_graphs``).
    """
    if name == "fused":
        return FusedBackend(weights, params, state, enc_par, max_batch, threads)
    if name == "reference":
        return ReferenceBackend(weights, params, state, enc_par, max_batch)
    if name == "cuda":
        from ..cuda.backend import CudaBackend  # torch.cuda set-up only where CUDA is asked for

        opts = dict(cuda_options or {})
        cfg = opts.pop("cfg", None)
        if cfg is None:
            raise ValueError("the cuda backend needs cuda_options={'cfg': <Config>}")
        return CudaBackend.from_config(cfg, weights, params, state, enc_par, **opts)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Backend", "FusedBackend", "HostBackend", "LearningViews", "ReferenceBackend", "StagedBuffers",
           "encoder_parameters", "make_backend", "unique_waves"]
