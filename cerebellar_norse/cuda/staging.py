"""Pure helpers of the CUDA backend: buffer sizing, stream rotation, waves, graph policy.

Nothing here touches a device, so all of it is tested on any host:

* :func:`staging_layout` – bytes of one stream's staging buffers for batches of up
  to ``batch`` ticks (pinned host and device, inputs and outputs);
* :func:`workspace_bytes` – an upper estimate of the transient device memory one
  stream's step needs (the budget charges it up front; the stream's CUDA graphs share
  its pool, or, with torch before 2.6, each graph is charged it again for a pool of its own);
* :class:`RoundRobin` – which stream takes the next batch;
* :func:`wave_layout` – batch order that makes every wave (the k-th tick of each
  market) one contiguous block, so a batch that repeats a market is stepped wave
  by wave in arrival order; :func:`split_waves` cuts waves into device launches of
  at most the ticks whose workspace fits the memory limit (:mod:`.plan`);
* :class:`GraphPolicy` – when a (stream, batch size) is captured as a CUDA graph,
  replayed, or run eagerly;
* :func:`encode_batch` – the shared numba tick encoder over a whole batch, writing
  mossy currents straight into a (pinned) staging buffer in wave order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal

import numba as nb
import numpy as np

from .. import kernelcache  # noqa: F401  (installs the guard: a failed write of numba's cache is no error)
from ..neurons.backends import unique_waves
from ..neurons.encoder import encode_tick_to_mossy
from ..neurons.parameters import NetworkShape

INDEX_BYTES = 8  # int64 slot indices
PROB_BYTES = 8  # float64 class probabilities
SPIKE_BYTES = 8  # int64 spike counts
N_POPULATIONS = 3  # spike counts of granule, Purkinje, DCN


@dataclass(frozen=True)
class StagingLayout:
    """Staging buffers of one stream, for batches of up to ``batch`` ticks.

    Inputs: slot indices (batch,) int64 and mossy currents (batch, mossy) in the
    network float type. Outputs: class probabilities (batch, classes) float64 and
    spike counts (batch, 3) int64. The same buffers exist twice: pinned on the host
    (the encoder writes into them, results are read from them) and on the device.
    """

    batch: int
    mossy: int
    classes: int
    float_bytes: int

    def buffers(self) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        """(name, shape, dtype) of each buffer: ``slots``, ``mossy`` (inputs), ``probs``, ``spikes`` (outputs)."""
        b = self.batch
        fdt = np.dtype(np.float32 if self.float_bytes == 4 else np.float64)
        return [("slots", (b,), np.dtype(np.int64)), ("mossy", (b, self.mossy), fdt),
                ("probs", (b, self.classes), np.dtype(np.float64)), ("spikes", (b, N_POPULATIONS), np.dtype(np.int64))]

    @property
    def in_bytes(self) -> int:
        """Input bytes per copy (slots + mossy currents)."""
        return self.batch * (INDEX_BYTES + self.mossy * self.float_bytes)

    @property
    def out_bytes(self) -> int:
        """Output bytes per copy (probabilities + spikes)."""
        return self.batch * (self.classes * PROB_BYTES + N_POPULATIONS * SPIKE_BYTES)

    @property
    def host_bytes(self) -> int:
        """Pinned host bytes of one stream."""
        return self.in_bytes + self.out_bytes

    @property
    def device_bytes(self) -> int:
        """Device bytes of one stream."""
        return self.in_bytes + self.out_bytes


def staging_layout(batch: int, shape: NetworkShape, float_bytes: int) -> StagingLayout:
    """The staging layout of one stream for batches of up to ``batch`` ticks."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    if float_bytes not in (4, 8):
        raise ValueError(f"float_bytes must be 4 or 8, got {float_bytes}")
    return StagingLayout(batch, shape.mossy, shape.classes, float_bytes)


def workspace_bytes(shape: NetworkShape, batch: int, float_bytes: int) -> int:
    """Upper estimate of the transient device bytes of one step of ``batch`` ticks.

    Per tick row: the gathered state and the new state (v and i of every cell, twice),
    the per-tick drives (mossy -> granule, mossy -> DCN), up to fourteen live
    temporaries of the LIF update per population, and the parallel fibres' gathered
    inputs and products (two per synapse), in the network float type; plus
    the float64 softmax. Rounded up to whole MiB per stream. Measured on an NVIDIA H200
    (torch's peak allocation over one eager step, ``tests/cuda/test_cuda_device.py``):
    12.8 MB for 256 ticks of the default network, 17.5 MB for 12 ticks of 24,000 granule
    cells, 96.0 MB for 4 ticks of 400,000 (about 15 floats per granule cell per tick),
    against 19 floats per granule cell counted here.
    """
    cells = shape.granule + shape.purkinje + shape.dcn + shape.classes
    # the parallel fibres' gather and products live beside the LIF temporaries; the mossy fibres' (G x D, at the
    # start of a tick) come before them and fit in their room
    per_row = (4 + 14) * cells + shape.granule + shape.dcn + 2 * shape.mossy + 2 * shape.purkinje * shape.pf_per_purkinje + 8
    total = batch * (per_row * float_bytes + 4 * shape.classes * 8)
    mib = 1 << 20
    return -(-total // mib) * mib


class RoundRobin:
    """Rotates over ``n`` streams: batch k goes to stream ``k % n``."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"need at least one stream, got {n}")
        self.n = n
        self._k = 0

    def next(self) -> int:
        """The stream of the next batch."""
        i = self._k
        self._k = (i + 1) % self.n
        return i

    def peek(self) -> int:
        """The stream the next batch will get, without taking it."""
        return self._k


def wave_layout(slots: np.ndarray) -> tuple[np.ndarray | None, list[tuple[int, int]]]:
    """Batch order and wave bounds for ``slots`` (B,).

    Returns ``(perm, bounds)``: staging row ``r`` holds batch position ``perm[r]``
    (``perm`` is None when the batch order already works, i.e. no slot repeats), and
    ``bounds`` are the ``[start, end)`` row ranges of the waves, stepped in order.
    Within a wave every slot occurs once; wave k holds the k-th tick of each market,
    so a market's ticks are applied in arrival order.
    """
    b = int(slots.shape[0])
    if b == 0:
        return None, []
    if b == 1 or np.unique(slots).size == b:
        return None, [(0, b)]
    waves = unique_waves(slots)
    perm = np.concatenate(waves).astype(np.int64)
    ends = np.cumsum([w.size for w in waves])
    starts = np.concatenate([[0], ends[:-1]])
    return perm, [(int(s), int(e)) for s, e in zip(starts, ends, strict=True)]


def split_waves(bounds: list[tuple[int, int]], most: int) -> list[tuple[int, int]]:
    """``bounds`` (``[start, end)`` row ranges) cut into consecutive ranges of at most ``most`` rows, in order.

    A wave's rows are distinct markets, so any of its pieces can be stepped on its own;
    the pieces of wave k all run before wave k+1, which keeps each market's ticks in order.
    """
    if most < 1:
        raise ValueError(f"most must be at least 1, got {most}")
    return [(a, min(a + most, e)) for start, e in bounds for a in range(start, e, most)]


Action = Literal["eager", "capture", "replay"]


class GraphPolicy:
    """Decides per batch whether to run eagerly, capture a CUDA graph, or replay one.

    A key (stream, batch size) runs eagerly ``warmup`` times (so lazy library state
    such as cuBLAS handles exists on that stream), is captured on the next
    occurrence, and replayed from then on. At most ``max_graphs`` graphs are kept; a
    key whose capture failed (or was refused by the memory budget) stays eager.

    Args:
        enabled: graphs at all (False on the CPU and with ``use_graphs=False``).
        warmup: eager runs of a key before its capture (>= 1).
        max_graphs: most graphs held at once.
    """

    def __init__(self, enabled: bool, warmup: int = 2, max_graphs: int = 64) -> None:
        if warmup < 1:
            raise ValueError(f"warmup must be at least 1, got {warmup}")
        self.enabled = enabled
        self.warmup = warmup
        self.max_graphs = max_graphs
        self.seen: Counter[Hashable] = Counter()
        self.captured: set[Hashable] = set()
        self.refused: set[Hashable] = set()

    def decide(self, key: Hashable, eligible: bool = True) -> Action:
        """The action for the next batch of ``key``; ``eligible`` is False for multi-wave batches."""
        if not self.enabled or not eligible:
            return "eager"
        if key in self.captured:
            return "replay"
        if key in self.refused or len(self.captured) >= self.max_graphs:
            return "eager"
        self.seen[key] += 1
        return "capture" if self.seen[key] > self.warmup else "eager"

    def record_captured(self, key: Hashable) -> None:
        """``key`` now has a graph."""
        self.captured.add(key)

    def record_refused(self, key: Hashable) -> None:
        """``key`` could not be captured; it stays eager."""
        self.refused.add(key)

    def forget(self) -> None:
        """Drop every graph decision (graphs were released)."""
        self.seen.clear()
        self.captured.clear()
        self.refused.clear()


@nb.njit(cache=True, nogil=True)
def encode_batch(order, slots, ticks, enc, enc_par, z_buf, slots_out, mossy_out):  # pragma: no cover - numba
    """Encode batch positions ``order`` (in that order) into staging rows 0..len(order)-1.

    Args:
        order: (n,) int64 batch positions, in staging (wave) order.
        slots: (B,) int64 state slot of each batch position.
        ticks: (3, B) float64 rows price, volume, time (ms).
        enc: (S, 12) float64 encoder states, updated in place.
        enc_par: float64 encoder parameters.
        z_buf: (3,) float64 scratch.
        slots_out: (>= n,) int64 staging slots, row r gets ``slots[order[r]]``.
        mossy_out: (>= n, M) staging mossy currents (network float type).
    """
    for r in range(order.shape[0]):
        b = order[r]
        s = slots[b]
        slots_out[r] = s
        encode_tick_to_mossy(enc[s], ticks[0, b], ticks[1, b], ticks[2, b], enc_par, z_buf, mossy_out[r])


__all__ = ["GraphPolicy", "RoundRobin", "StagingLayout", "encode_batch", "split_waves", "staging_layout", "wave_layout",
           "workspace_bytes"]
