"""Layouts of the flat arrays the fused kernel reads: one name for every slot.

The kernel (:mod:`.fused`) takes its inputs as a few flat arrays, because numba's
per-argument dispatch cost is a large part of a single-tick call. This module is the
only place that says where each value lies in them:

``coef`` (network float type, :data:`N_COEF` entries, filled by
:func:`~cerebellar_norse.neurons.parameters.kernel_coefficients`)
    One block of :data:`C_POP` entries per LIF population, starting at :data:`C_GR`
    (granule), :data:`C_PC` (Purkinje) and :data:`C_DN` (deep nuclei); within a block,
    :data:`C_MEM` = dt * tau_mem_inv, :data:`C_SYN` = -dt * tau_syn_inv (both
    dimensionless per step), :data:`C_LEAK` = v_leak, :data:`C_TH` = v_th and
    :data:`C_RESET` = v_reset (dimensionless potentials). The leaky-integrator readout
    at :data:`C_RO` has only the first three. Then the network scalars
    :data:`C_GOLGI_DECAY` … :data:`C_READOUT_SCALE`.

``dims`` (int64, :data:`N_DIMS` entries, built by :meth:`PackedLayout.dims`)
    Population sizes (cells), parallel-fibre synapses, state slots, the dense flag,
    then the start (elements) of every segment of ``wf`` and ``wi``, so the kernel
    slices them where :class:`PackedLayout` put them.

``wf`` (network float type) and ``wi`` (int32): the weights, as consecutive
segments in the order of :data:`WF_SEGMENTS` and :data:`WI_SEGMENTS`; see
:class:`PackedLayout`.

The argument table of a staged step (:mod:`.native`) holds the kernel's arrays in the
order of :data:`TABLE_ARGS` (``A_*`` entries).

The numba kernels read the ``C_*`` and ``D_*`` integers as compile-time constants, and
numba's on-disk cache of a kernel is keyed on its own source file only: after
changing a constant here, delete the cached kernels (``__pycache__/*.nbi``, ``*.nbc``)
of :mod:`.fused`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .parameters import NetworkShape

# -- coef ------------------------------------------------------------------------
# Offsets within one population's block.
C_MEM, C_SYN, C_LEAK, C_TH, C_RESET = range(5)
C_POP = 5  # entries per LIF population
C_GR = 0  # granule cells
C_PC = C_GR + C_POP  # Purkinje cells
C_DN = C_PC + C_POP  # deep cerebellar nuclei
C_RO = C_DN + C_POP  # readout (leaky integrator: C_MEM, C_SYN and C_LEAK only)
C_GOLGI_DECAY = C_RO + 3  # fraction of the Golgi inhibition kept per step
C_GOLGI_BASE = C_GOLGI_DECAY + 1  # Golgi leak target term (current per step)
C_GOLGI_RATE = C_GOLGI_BASE + 1  # Golgi homeostatic gain (current per unit activity error, per step)
C_TARGET = C_GOLGI_RATE + 1  # target fraction of granule cells spiking per step
C_N_GRANULE = C_TARGET + 1  # granule cells (as a float, the activity denominator)
C_READOUT_SCALE = C_N_GRANULE + 1  # readout potential -> logit multiplier
N_COEF = C_READOUT_SCALE + 1
# Block start of each LIF population, in the order of neurons.parameters.POPULATIONS.
C_LIF_POPULATIONS = (C_GR, C_PC, C_DN)

# -- wf / wi -----------------------------------------------------------------------
# Segments in storage order. Float: dendrite weights (D, G) dendrite-major; parallel-fibre
# weights in CSR order (nnz); Purkinje bias (P); mossy -> DCN transposed (M, N);
# Purkinje -> DCN transposed (P, N); DCN bias (N); DCN -> readout (K, N); the parallel-fibre weights
# again as dense rows (G, P), present only in dense layouts.
WF_SEGMENTS = ("mg_w", "pf_w", "pc_bias", "w_md_t", "w_pd_t", "dcn_bias", "w_out", "pf_rows")
# Int32: mossy fibre of each dendrite (D, G); CSR row pointers (G + 1); Purkinje cell of each CSR entry (nnz).
WI_SEGMENTS = ("mg_idx", "pf_ptr", "pf_post")

# Networks with at most this many granule x Purkinje pairs also get the parallel-fibre
# weights as dense rows (zeros where no synapse): adding a spiking cell's whole row is
# vectorised and avoids the store-forwarding stalls of scattered adds, with the same
# sum per Purkinje cell in the same order (x + 0 = x).
DENSE_PF_MAX = 4_000_000

# -- argument table ----------------------------------------------------------------
# Arrays of the kernel's argument table (neurons.native.ArgTable), in table order, as
# tick_batch takes them: staged slots (B,) and ticks (3, B); the slot state buffer and
# encoder states; wf, wi, dims, coef, encoder parameters; one thread's scratch rows;
# the output buffers probs (B, K), spikes (B, 3) and active (B, G).
TABLE_ARGS = ("slots", "ticks", "state_f", "enc", "wf", "wi", "dims", "coef", "enc_par",
              "work_f", "work_i", "work_z", "probs", "spikes", "active")
(A_SLOTS, A_TICKS, A_STATE_F, A_ENC, A_WF, A_WI, A_DIMS, A_COEF, A_ENC_PAR,
 A_WORK_F, A_WORK_I, A_WORK_Z, A_PROBS, A_SPIKES, A_ACTIVE) = range(len(TABLE_ARGS))

# -- dims --------------------------------------------------------------------------
# Sizes: mossy fibres, granule cells, dendrites per granule cell, Purkinje cells, DCN
# cells, classes, parallel-fibre synapses, state slots, 1 when wf holds the dense rows.
D_M, D_G, D_DEN, D_P, D_N, D_K, D_NNZ, D_SLOTS, D_DENSE = range(9)
# Segment starts (elements) in wf, then in wi.
(D_MG_W, D_PF_W, D_PC_BIAS, D_W_MD_T, D_W_PD_T, D_DCN_BIAS, D_W_OUT, D_PF_ROWS,
 D_MG_IDX, D_PF_PTR, D_PF_POST) = range(D_DENSE + 1, D_DENSE + 1 + len(WF_SEGMENTS) + len(WI_SEGMENTS))
N_DIMS = D_PF_POST + 1


def uses_dense_rows(shape: NetworkShape) -> bool:
    """True when a network of ``shape`` is small enough for dense parallel-fibre rows."""
    return shape.granule * shape.purkinje <= DENSE_PF_MAX


def segment_shapes(shape: NetworkShape, dense: bool) -> dict[str, tuple[int, ...]]:
    """Array shape (elements per axis) of every segment of ``wf`` and ``wi``, by name."""
    s = shape
    nnz = s.purkinje * s.pf_per_purkinje
    return {
        "mg_w": (s.dendrites, s.granule),
        "pf_w": (nnz,),
        "pc_bias": (s.purkinje,),
        "w_md_t": (s.mossy, s.dcn),
        "w_pd_t": (s.purkinje, s.dcn),
        "dcn_bias": (s.dcn,),
        "w_out": (s.classes, s.dcn),
        "pf_rows": (s.granule if dense else 0, s.purkinje),
        "mg_idx": (s.dendrites, s.granule),
        "pf_ptr": (s.granule + 1,),
        "pf_post": (nnz,),
    }


def _extents(names: tuple[str, ...], shapes: dict[str, tuple[int, ...]]) -> tuple[dict[str, slice], int]:
    """Consecutive slices of the segments ``names`` and the total length (elements)."""
    out: dict[str, slice] = {}
    o = 0
    for name in names:
        n = int(np.prod(shapes[name]))
        out[name] = slice(o, o + n)
        o += n
    return out, o


@dataclass(frozen=True)
class PackedLayout:
    """Where each weight segment lies in ``wf`` (float) and ``wi`` (int32) for one network shape.

    Every field but ``shape``, ``dense`` and the sizes is a ``slice`` (elements) of
    ``wf`` (``mg_w`` … ``pf_rows``) or ``wi`` (``mg_idx``, ``pf_ptr``, ``pf_post``);
    :meth:`shape_of` gives the array shape stored there. ``pf_rows`` is empty unless
    ``dense``.
    """

    shape: NetworkShape
    dense: bool
    mg_w: slice
    pf_w: slice
    pc_bias: slice
    w_md_t: slice
    w_pd_t: slice
    dcn_bias: slice
    w_out: slice
    pf_rows: slice
    mg_idx: slice
    pf_ptr: slice
    pf_post: slice
    wf_size: int
    wi_size: int

    @classmethod
    def of(cls, shape: NetworkShape, dense: bool | None = None) -> PackedLayout:
        """The layout of ``shape``; ``dense`` defaults to :func:`uses_dense_rows`."""
        dense = uses_dense_rows(shape) if dense is None else dense
        shapes = segment_shapes(shape, dense)
        wf, wf_size = _extents(WF_SEGMENTS, shapes)
        wi, wi_size = _extents(WI_SEGMENTS, shapes)
        return cls(shape=shape, dense=dense, **wf, **wi, wf_size=wf_size, wi_size=wi_size)

    def shape_of(self, name: str) -> tuple[int, ...]:
        """Array shape of segment ``name``."""
        return segment_shapes(self.shape, self.dense)[name]

    def slice_of(self, name: str) -> slice:
        """Slice of segment ``name`` in ``wf`` or ``wi``."""
        if name not in WF_SEGMENTS and name not in WI_SEGMENTS:
            raise KeyError(name)
        sl: slice = getattr(self, name)
        return sl

    def dims(self, slots: int) -> np.ndarray:
        """The int64 ``dims`` array of the kernel for ``slots`` state slots."""
        s = self.shape
        d = np.zeros(N_DIMS, dtype=np.int64)
        d[D_M], d[D_G], d[D_DEN], d[D_P], d[D_N], d[D_K] = s.mossy, s.granule, s.dendrites, s.purkinje, s.dcn, s.classes
        d[D_NNZ] = s.purkinje * s.pf_per_purkinje
        d[D_SLOTS] = slots
        d[D_DENSE] = int(self.dense)
        for slot, name in zip(DIMS_STARTS, WF_SEGMENTS + WI_SEGMENTS, strict=True):
            d[slot] = self.slice_of(name).start
        return d


# dims slot of each segment's start, in the order of WF_SEGMENTS + WI_SEGMENTS.
DIMS_STARTS = (D_MG_W, D_PF_W, D_PC_BIAS, D_W_MD_T, D_W_PD_T, D_DCN_BIAS, D_W_OUT, D_PF_ROWS, D_MG_IDX, D_PF_PTR, D_PF_POST)
