"""One step of the data flow, shared by the engine and the Python API: ticks -> slots -> backend -> head -> results.

:func:`step_ticks` gives each tick its market's state slot, steps the backend and
applies the model's calibrated head; :func:`tick_results` turns the step's arrays into
:class:`~cerebellar_norse.engine.records.TickResult` objects. Both the service engine
and :class:`~cerebellar_norse.neurons.network.CerebellarNetwork` call exactly these, so
every path answers alike.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np

from .. import kernelcache  # noqa: F401  (installs the guard: a failed write of numba's cache is no error)
from ..neurons.backends import Backend
from ..neurons.encoder import S_N_TICKS
from ..neurons.fused import softmax_row, tick_batch_table
from ..neurons.native import ArgTable, compiled_entry, table_at, view1, view2
from ..neurons.topology import Weights
from ..ticks import Tick
from .pool import StatePool
from .records import TickResult

_LN3 = math.log(3.0)


def tick_results(ticks: Sequence[Tick], buf: StepBuffers, elapsed_ns: int, warmup_ticks: int = 0,
                 model_version: str = "") -> list[TickResult]:
    """The results of the step :func:`step_ticks` just made of ``ticks`` with ``buf``.

    Reads the finishing pass's rows: probabilities, confidence, spikes per tick and the
    ticks each market has seen (a result is ``warming_up`` while that is at most
    ``warmup_ticks``); ``elapsed_ns``, the step's time, is divided evenly among the ticks.

    Plain Python per row: for the small batches of live serving, numpy's per-call
    overhead would cost more than the kernel, and one code path for every batch size
    keeps a tick's result bit-identical whether it was batched or not.
    """
    b = len(ticks)
    per_tick = elapsed_ns // max(b, 1)
    return [TickResult(t.market_id, p[0], p[1], p[2], c, n, per_tick, s <= warmup_ticks, model_version)
            for t, p, c, n, s in zip(ticks, buf.probs[:b].tolist(), buf.confidence[:b].tolist(),
                                     buf.totals[:b].tolist(), buf.seen[:b].tolist(), strict=True)]


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _finish_batch(slots: np.ndarray, enc: np.ndarray, scratch: np.ndarray, seen: np.ndarray, probs: np.ndarray,
                  gain: np.ndarray, bias: np.ndarray, apply_head: bool, spikes: np.ndarray, confidence: np.ndarray,
                  totals: np.ndarray, populations: np.ndarray) -> None:
    """Ticks seen per market (after a step), the calibrated head (with ``apply_head``), confidence, spike sums.

    ``seen[j]`` is the market's tick count including tick j (later ticks of the same
    market in the batch are subtracted from the count after the step). The head maps
    each row ``p`` to ``softmax(gain * log p + bias)``, in place. ``confidence[j]`` is
    ``1 - H(p)/ln 3`` of the served row, clipped to [0, 1]; ``totals[j]`` the tick's
    spikes over all populations; ``populations`` (3,) the batch's spikes per population.
    """
    b = slots.shape[0]
    for j in range(b):
        scratch[slots[j]] = enc[slots[j], S_N_TICKS]
    for j in range(b - 1, -1, -1):
        s = slots[j]
        seen[j] = scratch[s]
        scratch[s] -= 1.0
    if apply_head:
        for j in range(b):
            for c in range(probs.shape[1]):
                probs[j, c] = gain[c] * math.log(max(probs[j, c], 1e-300)) + bias[c]
            softmax_row(probs[j])
    for k in range(populations.shape[0]):
        populations[k] = 0
    for j in range(b):
        acc = 0.0
        for c in range(probs.shape[1]):
            x = probs[j, c]
            if x > 0.0:
                acc += x * math.log(x)
        h = -acc
        confidence[j] = min(max(1.0 - h / _LN3, 0.0), 1.0)
        n = 0
        for k in range(spikes.shape[1]):
            n += spikes[j, k]
            populations[k] += spikes[j, k]
        totals[j] = n


# Arrays of the finishing pass's argument table, in order.
(F_SLOTS, F_ENC, F_SCRATCH, F_SEEN, F_PROBS, F_GAIN, F_BIAS, F_SPIKES, F_CONFIDENCE, F_TOTALS,
 F_POPULATIONS) = range(11)


@nb.njit(cache=True, error_model="numpy")  # holds the GIL, as the kernel's call (fused.tick_batch_table)
def _finish_batch_table(address: int, n_args: int, b: int, apply_head: bool) -> None:
    """:func:`_finish_batch` of the first ``b`` ticks, its arrays read from an argument table (order ``F_*``)."""
    t = table_at(address, n_args)
    _finish_batch(view1(t, F_SLOTS, nb.int64)[:b], view2(t, F_ENC, nb.float64), view1(t, F_SCRATCH, nb.float64),
                  view1(t, F_SEEN, nb.float64), view2(t, F_PROBS, nb.float64), view1(t, F_GAIN, nb.float64),
                  view1(t, F_BIAS, nb.float64), apply_head, view2(t, F_SPIKES, nb.int64),
                  view1(t, F_CONFIDENCE, nb.float64), view1(t, F_TOTALS, nb.int64), view1(t, F_POPULATIONS, nb.int64))


@nb.njit(cache=True, error_model="numpy")  # holds the GIL, as its two parts do
def _fused_step_table(k_address: int, k_args: int, b: int, steps: int, fzero: Any, f_address: int, f_args: int,
                      apply_head: bool) -> None:
    """The fused kernel's step of the first ``b`` staged ticks (:func:`.fused.tick_batch_table` of ``k_address``,
    ``k_args``, ``steps``, ``fzero``), then the finishing pass (:func:`_finish_batch_table` of ``f_address``,
    ``f_args``, ``apply_head``): one call from Python for both."""
    tick_batch_table(k_address, k_args, b, steps, fzero)
    _finish_batch_table(f_address, f_args, b, apply_head)


@dataclass
class StepBuffers:
    """Preallocated inputs and outputs of :func:`step_ticks` for batches up to ``max_batch`` ticks.

    ``slots``, ``ticks`` and ``probs`` are the backend's own buffers
    (``Backend.input_buffers``, ``Backend.output_buffers``).
    """

    slots: np.ndarray  # (B,) int64 slot of each tick
    ticks: np.ndarray  # (3, B) float64 price, volume, time (ms)
    probs: np.ndarray  # (B, K) float64 the backend's probabilities, then the served ones
    spikes: np.ndarray  # (B, 3) int64 the backend's spikes per population
    seen: np.ndarray  # (B,) float64 ticks seen by the tick's market, including it
    confidence: np.ndarray  # (B,) float64 confidence of each served row
    totals: np.ndarray  # (B,) int64 spikes of each tick, all populations
    populations: np.ndarray  # (3,) int64 spikes of the step per population
    scratch: np.ndarray  # (S,) float64, one per state slot
    head_of: object = None  # the weights whose head ``table`` holds
    apply_head: bool = False
    table: ArgTable | None = None  # the finishing pass's arrays (order F_*)
    finish: Any = None  # _finish_batch_table's compiled variant, resolved on the first step
    fused: Any = None  # _fused_step_table's compiled variant, resolved on the first step through it

    @classmethod
    def allocate(cls, backend: Backend, max_batch: int, n_slots: int) -> StepBuffers:
        """Buffers for ``max_batch`` ticks (at most the backend's) over ``n_slots`` state slots."""
        slots, ticks = backend.input_buffers()
        probs, spikes = backend.output_buffers()
        if slots.shape[0] < max_batch:
            raise ValueError(f"the backend stages {slots.shape[0]} ticks, fewer than a batch of {max_batch}")
        return cls(slots, ticks, probs, spikes, np.zeros(max_batch), np.zeros(max_batch), np.zeros(max_batch, dtype=np.int64),
                   np.zeros(spikes.shape[1], dtype=np.int64), np.zeros(n_slots))

    def finish_table(self, weights: Weights, enc: np.ndarray) -> ArgTable:
        """The finishing pass's argument table for ``weights``' head over the encoder states ``enc``."""
        t = self.table
        if weights is not self.head_of or t is None or t.arrays[F_ENC] is not enc:
            self.apply_head = not weights.head_is_identity
            t = self.table = ArgTable((self.slots, enc, self.scratch, self.seen, self.probs,
                                       np.ascontiguousarray(weights.head_gain, dtype=np.float64),
                                       np.ascontiguousarray(weights.head_bias, dtype=np.float64),
                                       self.spikes, self.confidence, self.totals, self.populations))
            self.head_of = weights
        return t


def step_ticks(pool: StatePool, backend: Backend, weights: Weights, ticks: Sequence[Tick],
               buf: StepBuffers) -> tuple[np.ndarray, np.ndarray, int]:
    """Give each tick its market's slot, step the backend, apply the model's calibrated head.

    Fills the first ``len(ticks)`` rows of ``buf`` (seen, confidence, totals) and its
    ``populations`` (see :func:`_finish_batch`). Returns probabilities, spikes and the
    time in ns (backend step and finishing pass).
    """
    slots, arr = buf.slots, buf.ticks
    for j, t in enumerate(ticks):
        slots[j] = pool.table.acquire(t.market_id)
        arr[0, j], arr[1, j], arr[2, j] = t.price, t.volume, t.timestamp
    return _step_rows(backend, weights, pool.arrays.enc, buf, len(ticks))


def _step_rows(backend: Backend, weights: Weights, enc: np.ndarray, buf: StepBuffers,
               b: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Step the first ``b`` staged rows of ``buf`` through the backend and the finishing pass; time in ns.

    Where the backend hands over its fused kernel's arguments (``Backend.fused_step``), both run in one call into
    compiled code (:func:`_fused_step_table`) instead of ``step_buffered`` and a second call: the backend's Python
    wrapper and the second call cost 5–8 % of a single tick's window (docs/benchmarks.md, "One compiled call per step").
    ``b`` is at most the staged buffers' length (the rows were filled).
    """
    table = buf.finish_table(weights, enc)
    fused = backend.fused_step()
    if fused is not None and b < fused.threaded_from:
        kernel = fused.table  # (one read: the backend's weights may be swapped meanwhile, this keeps them alive)
        entry = buf.fused
        if entry is None:
            entry = buf.fused = compiled_entry(_fused_step_table, kernel.address, kernel.size, b, fused.steps,
                                               fused.fzero, table.address, table.size, buf.apply_head)
        t0 = time.perf_counter_ns()
        entry(kernel.address, kernel.size, b, fused.steps, fused.fzero, table.address, table.size, buf.apply_head)
        t1 = time.perf_counter_ns()
        probs, spikes = fused.outputs[b]
        return probs, spikes, t1 - t0
    finish = buf.finish
    if finish is None:
        finish = buf.finish = compiled_entry(_finish_batch_table, table.address, table.size, b, buf.apply_head)
    t0 = time.perf_counter_ns()
    probs, spikes = backend.step_buffered(b)
    finish(table.address, table.size, b, buf.apply_head)
    return probs, spikes, time.perf_counter_ns() - t0


def warm_step(backend: Backend, weights: Weights, enc: np.ndarray, buf: StepBuffers, slot: int) -> bool:
    """Step the last batch's first tick again, on ``slot``, through the backend and the finishing pass.

    Keeps the network's code, branch history and weights in the CPU's caches between
    ticks milliseconds apart. ``slot`` must hold no market (:meth:`.SlotTable.spare`):
    its state changes, and nothing else a client can see does (row 0 of ``buf``'s
    outputs is overwritten, as the next batch overwrites it). Returns False, stepping
    nothing, before the first batch (``buf`` holds no tick yet).
    """
    if buf.finish is None and buf.fused is None:  # (each is resolved at the first step that runs through it)
        return False
    buf.slots[0] = slot
    _step_rows(backend, weights, enc, buf, 1)
    return True
