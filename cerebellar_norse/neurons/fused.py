"""Fused, event-driven numba kernel of the cerebellar network (CPU fast path).

Implements exactly the equations of :mod:`cerebellar_norse.neurons.functional`
(Norse's ``lif_feed_forward_step``/``li_feed_forward_step``), with the same order of
floating point operations where it matters:

* encoder, granule, Golgi, Purkinje, DCN and readout updates fused in one call that
  steps a whole batch of markets through ``steps_per_tick`` steps;
* parallel-fibre input is event-driven: only the CSR rows of granule cells that
  spiked are read, so the cost of that layer is proportional to the spikes, not to
  granule_size x Purkinje cells;
* no allocation: states are updated in place in the slot arrays, scratch space comes
  from preallocated buffers (:class:`FusedWorkspace`).

Arguments are packed into a few flat arrays (:class:`PackedWeights`, the state
buffer of :class:`~cerebellar_norse.neurons.state.StateArrays`) because numba's
per-argument dispatch cost (~40 ns each) is a large part of a single-tick call; where
each value lies in them is defined once, in :mod:`.layout`.

Batch entries are processed in order, so several ticks of one market in the same
batch are applied in arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from .. import kernelcache  # noqa: F401  (installs the guard: a failed write of numba's cache is no error)
from .encoder import encode_tick_to_mossy
from .layout import (
    A_ACTIVE,
    A_COEF,
    A_DIMS,
    A_ENC,
    A_ENC_PAR,
    A_PROBS,
    A_SLOTS,
    A_SPIKES,
    A_STATE_F,
    A_TICKS,
    A_WF,
    A_WI,
    A_WORK_F,
    A_WORK_I,
    A_WORK_Z,
    C_DN,
    C_GOLGI_BASE,
    C_GOLGI_DECAY,
    C_GOLGI_RATE,
    C_GR,
    C_LEAK,
    C_MEM,
    C_N_GRANULE,
    C_PC,
    C_READOUT_SCALE,
    C_RESET,
    C_RO,
    C_SYN,
    C_TARGET,
    C_TH,
    D_DCN_BIAS,
    D_DEN,
    D_DENSE,
    D_G,
    D_K,
    D_M,
    D_MG_IDX,
    D_MG_W,
    D_N,
    D_NNZ,
    D_P,
    D_PC_BIAS,
    D_PF_POST,
    D_PF_PTR,
    D_PF_ROWS,
    D_PF_W,
    D_SLOTS,
    D_W_MD_T,
    D_W_OUT,
    D_W_PD_T,
    WF_SEGMENTS,
    WI_SEGMENTS,
    PackedLayout,
)
from .native import rows_of, table_at, view1, view2
from .parameters import NetworkShape
from .state import state_views
from .topology import Weights


@dataclass(frozen=True)
class PackedWeights:
    """Weights flattened for the kernel: ``wf`` (float) and ``wi`` (int32) laid out as ``layout`` says.

    With ``layout.dense``, ``wf`` also holds the parallel-fibre weights as dense rows (G, P).
    """

    wf: np.ndarray
    wi: np.ndarray
    layout: PackedLayout

    @property
    def dense(self) -> bool:
        """True when ``wf`` holds the dense parallel-fibre rows."""
        return self.layout.dense

    @classmethod
    def pack(cls, w: Weights, dtype: np.dtype, dense: bool | None = None) -> PackedWeights:
        """Pack ``w`` (any float type) into the kernel layout in ``dtype``.

        ``dense`` overrides the layout's choice of dense parallel-fibre rows (by default
        :func:`~cerebellar_norse.neurons.layout.uses_dense_rows`); the kernel's ``dims``
        must come from the same layout.
        """
        if w.pf_ptr[-1] >= 2**31:
            raise ValueError("more than 2^31 parallel-fibre synapses are not supported by the CPU kernel")
        lay = PackedLayout.of(w.shape, dense)
        wf = np.empty(lay.wf_size, dtype=dtype)
        for name, a in (("mg_w", w.mg_w.T), ("pf_w", w.pf_w_csr()), ("pc_bias", w.pc_bias), ("w_md_t", w.w_md.T),
                        ("w_pd_t", w.w_pd.T), ("dcn_bias", w.dcn_bias), ("w_out", w.w_out)):
            wf[lay.slice_of(name)] = np.asarray(a, dtype=dtype).reshape(-1)
        rows = wf[lay.pf_rows].reshape(lay.shape_of("pf_rows"))
        rows[:] = 0
        if lay.dense:
            s = lay.shape
            rows[w.pf_pre.reshape(-1), np.repeat(np.arange(s.purkinje), s.pf_per_purkinje)] = w.pf_w.reshape(-1)
        wi = np.empty(lay.wi_size, dtype=np.int32)
        for name, a in (("mg_idx", w.mg_idx.T), ("pf_ptr", w.pf_ptr), ("pf_post", w.pf_post)):
            wi[lay.slice_of(name)] = np.asarray(a).reshape(-1)
        return cls(wf, wi, lay)

    def floats(self, name: str) -> np.ndarray:
        """Live view of float segment ``name`` (one of ``WF_SEGMENTS``) of ``wf``, in its array shape."""
        if name not in WF_SEGMENTS:
            raise KeyError(f"{name!r} is not a segment of wf")
        return self.wf[self.layout.slice_of(name)].reshape(self.layout.shape_of(name))

    def ints(self, name: str) -> np.ndarray:
        """Live view of int32 segment ``name`` (one of ``WI_SEGMENTS``) of ``wi``, in its array shape."""
        if name not in WI_SEGMENTS:
            raise KeyError(f"{name!r} is not a segment of wi")
        return self.wi[self.layout.slice_of(name)].reshape(self.layout.shape_of(name))


def make_dims(shape: NetworkShape, slots: int, dense: bool | None = None) -> np.ndarray:
    """The int64 dims array of the kernel (:meth:`PackedLayout.dims`; ``dense`` as in :meth:`PackedWeights.pack`)."""
    return PackedLayout.of(shape, dense).dims(slots)


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _lif_cell(v_arr, i_arr, k, inp, c_mem, nc_syn, v_leak, v_th, v_reset):
    """One Norse LIF feed-forward step of cell ``k`` in place; True when it spiked.

    ``i += inp; v += c_mem * ((v_leak - v) + i); i += nc_syn * i; spike and reset at v > v_th``
    with ``c_mem = dt * tau_mem_inv`` and ``nc_syn = -dt * tau_syn_inv``. Branch-free (the reset
    is a select), so a loop over a layer's cells that stores the result as a flag vectorises.
    """
    i_new = i_arr[k] + inp
    v = v_arr[k]
    v_dec = v + c_mem * ((v_leak - v) + i_new)
    i_arr[k] = i_new + nc_syn * i_new
    fired = v_dec > v_th
    v_arr[k] = v_reset if fired else v_dec
    return fired


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _list_flagged(flags, out):
    """Write the indices of the cells flagged in ``flags`` (one byte per cell, 0 or 1) to ``out`` (one entry per
    cell, ``len(out) <= len(flags)``) in ascending order; returns how many.

    Without a branch: every index is written and the count advances by the flag, so the next
    index overwrites it unless the cell fired. Which of a layer's cells fire is not
    predictable, and the earlier version, one test per eight cells and one pass per spike,
    spent more time in mispredicted branches than in its own instructions.
    """
    cnt = np.uint64(0)  # unsigned: no negative-index wraparound on the store
    for g in range(out.shape[0]):
        out[cnt] = g
        cnt += flags[g]
    return np.int64(cnt)


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def softmax_row(row):
    """``row`` (float64 logits) replaced by its softmax, in place (max subtracted first)."""
    mx = -np.inf
    for c in range(row.shape[0]):
        mx = max(mx, row[c])
    tot = 0.0
    for c in range(row.shape[0]):
        row[c] = np.exp(row[c] - mx)
        tot += row[c]
    for c in range(row.shape[0]):
        row[c] /= tot


# Ticks whose granule inputs are computed side by side (one SIMD register of float32), and
# the fewest ticks for which that beats one tick at a time.
LANES = 8
LANES_MIN = 4
assert LANES == 8, "_granule_input_lanes writes its eight lanes out one by one"


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _granule_input(mossy, mg_w, mg_idx, out):
    """Granule input ``out`` (G,) of one tick's mossy currents (M,): dendrite weight x mossy current, summed.

    Dendrite-major; the sum order per cell is d = 0..D-1, i.e. ascending mossy index, as in
    the reference's dense product.
    """
    D, G = mg_w.shape
    if D == 4:  # the default: each cell's sum kept in a register, one store per cell
        for g in range(G):
            out[g] = (((mg_w[0, g] * mossy[mg_idx[0, g]]) + mg_w[1, g] * mossy[mg_idx[1, g]])
                      + mg_w[2, g] * mossy[mg_idx[2, g]]) + mg_w[3, g] * mossy[mg_idx[3, g]]
        return
    for g in range(G):
        out[g] = mg_w[0, g] * mossy[mg_idx[0, g]]
    for d in range(1, D):
        for g in range(G):
            out[g] += mg_w[d, g] * mossy[mg_idx[d, g]]


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _granule_input_lanes(mossy_blk, mossy_t, mg_w, mg_idx, out):
    """:func:`_granule_input` of LANES ticks at once: ``mossy_blk`` (LANES, M) in, ``out`` (G * LANES,) out.

    ``mossy_t`` (M * LANES,) and ``out`` are flat, row-major (M, LANES) and (G, LANES): the
    currents transposed, and the granule inputs with the LANES ticks of a cell side by
    side. Each synapse's weight multiplies one contiguous row of the transposed currents,
    so the LANES sums of a cell run in one vector with no gathers; every sum keeps the
    order of :func:`_granule_input`. Rows of ``mossy_blk`` past the batch hold stale
    (finite) currents whose columns nobody reads. ``mg_idx`` is unsigned, so a row's
    offset is one shift (no negative-index wraparound, no multiply by a run-time stride).

    The lanes are written out one by one, every load before any store: ``out`` and
    ``mossy_t`` are slices of one scratch buffer, so a loop over the lanes would be kept
    scalar for fear that a store changes a later load; written this way the compiler
    packs them into one vector multiply and add (same operations, same rounding).
    """
    D, G = mg_w.shape
    M = mossy_blk.shape[1]
    for m in range(M):
        for q in range(LANES):
            mossy_t[m * LANES + q] = mossy_blk[q, m]
    for g in range(G):
        w = mg_w[0, g]
        r = mg_idx[0, g] * LANES
        r0, r1, r2, r3 = mossy_t[r], mossy_t[r + 1], mossy_t[r + 2], mossy_t[r + 3]
        r4, r5, r6, r7 = mossy_t[r + 4], mossy_t[r + 5], mossy_t[r + 6], mossy_t[r + 7]
        o = g * LANES
        out[o], out[o + 1], out[o + 2], out[o + 3] = w * r0, w * r1, w * r2, w * r3
        out[o + 4], out[o + 5], out[o + 6], out[o + 7] = w * r4, w * r5, w * r6, w * r7
    for d in range(1, D):
        for g in range(G):
            w = mg_w[d, g]
            r = mg_idx[d, g] * LANES
            o = g * LANES
            r0, r1, r2, r3 = mossy_t[r], mossy_t[r + 1], mossy_t[r + 2], mossy_t[r + 3]
            r4, r5, r6, r7 = mossy_t[r + 4], mossy_t[r + 5], mossy_t[r + 6], mossy_t[r + 7]
            o0, o1, o2, o3 = out[o], out[o + 1], out[o + 2], out[o + 3]
            o4, o5, o6, o7 = out[o + 4], out[o + 5], out[o + 6], out[o + 7]
            out[o], out[o + 1], out[o + 2], out[o + 3] = o0 + w * r0, o1 + w * r1, o2 + w * r2, o3 + w * r3
            out[o + 4], out[o + 5], out[o + 6], out[o + 7] = o4 + w * r4, o5 + w * r5, o6 + w * r6, o7 + w * r7


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _dcn_drive_lanes(mossy_t, w_md_t, zero, out):
    """The DCN's mossy drive of LANES ticks at once: ``mossy_t`` (M * LANES,) in, ``out`` (N * LANES,) out.

    Both flat, row-major (M, LANES) and (N, LANES). Each weight multiplies one row of the
    transposed currents, so the LANES sums of a DCN cell run in one vector; every sum
    starts at ``zero`` and adds m = 0..M-1 in order, as the one-tick loop does (the bias
    is added after, by the caller). Written lane by lane for the reason given in
    :func:`_granule_input_lanes`.
    """
    M, N = w_md_t.shape
    for k in range(N * LANES):
        out[k] = zero
    for m in range(M):
        r = m * LANES
        x0, x1, x2, x3 = mossy_t[r], mossy_t[r + 1], mossy_t[r + 2], mossy_t[r + 3]
        x4, x5, x6, x7 = mossy_t[r + 4], mossy_t[r + 5], mossy_t[r + 6], mossy_t[r + 7]
        w_row = w_md_t[m]
        for n in range(N):
            w = w_row[n]
            o = n * LANES
            o0, o1, o2, o3 = out[o], out[o + 1], out[o + 2], out[o + 3]
            o4, o5, o6, o7 = out[o + 4], out[o + 5], out[o + 6], out[o + 7]
            out[o], out[o + 1], out[o + 2], out[o + 3] = o0 + w * x0, o1 + w * x1, o2 + w * x2, o3 + w * x3
            out[o + 4], out[o + 5], out[o + 6], out[o + 7] = o4 + w * x4, o5 + w * x5, o6 + w * x6, o7 + w * x7


@nb.njit(cache=True, nogil=True, error_model="numpy")
def tick_batch(slots, ticks, state_f, enc, wf, wi, dims, coef, enc_par, steps,
               work_f, work_i, work_z, probs, spikes, active):
    """Step ``len(slots)`` market ticks through ``steps`` integration steps each, in order.

    Args:
        slots: (B,) int64 state slot of each tick.
        ticks: (3, B) float64 rows price, volume, time (ms since epoch).
        state_f: flat float state buffer of the slot arrays (see neurons.state).
        enc: (S, 12) float64 encoder states.
        wf, wi: packed weights (see PackedWeights; layout in neurons.layout).
        dims: int64 sizes and segment starts (``D_*`` slots of neurons.layout).
        coef: kernel coefficients (``C_*`` slots of neurons.layout).
        enc_par: float64 encoder parameters.
        steps: integration steps per tick.
        work_f, work_i, work_z: scratch buffers of one thread (see FusedWorkspace).
        probs: (B, K) float64 output class probabilities.
        spikes: (B, 3) int64 output spikes per population over the tick.
        active: (B, G) uint8 output, 1 for granule cells that spiked during the tick
            (the eligibility of their parallel-fibre synapses for climbing-fibre learning).
    """
    _run(slots, slots, 0, slots.shape[0], False, ticks, state_f, enc, wf, wi, dims, coef, enc_par, steps,
         work_f, work_i, work_z, probs, spikes, active)


# The serving path's call (this, and the engine's finishing pass) holds the GIL: one released for a few µs
# is taken by any other Python thread that wants it (a checkpoint's write, a request's worker thread), and
# the step then waits up to sys.getswitchinterval() (5 ms) to get it back, inside the tick's measured
# processing time. (numba's parallel launch, tick_batch_parallel, releases it whatever the flag says.)
@nb.njit(cache=True, error_model="numpy")
def tick_batch_table(address, n_args, b, steps, fzero):
    """:func:`tick_batch` of the first ``b`` staged ticks, its arrays read from an argument table.

    ``address`` is an :class:`~cerebellar_norse.neurons.native.ArgTable`'s table of
    ``n_args`` arrays in the order of ``layout.TABLE_ARGS``; ``fzero`` is a zero of the
    network's float type (it selects the compiled variant). Same arithmetic as
    :func:`tick_batch`, without the cost of handing sixteen arrays over.
    """
    t = table_at(address, n_args)
    slots = view1(t, A_SLOTS, nb.int64)
    _run(slots, slots, 0, b, False, view2(t, A_TICKS, nb.float64), view1(t, A_STATE_F, fzero),
         view2(t, A_ENC, nb.float64), view1(t, A_WF, fzero), view1(t, A_WI, nb.int32), view1(t, A_DIMS, nb.int64),
         view1(t, A_COEF, fzero), view1(t, A_ENC_PAR, nb.float64), steps, view1(t, A_WORK_F, fzero),
         view1(t, A_WORK_I, nb.int32), view1(t, A_WORK_Z, nb.float64), view2(t, A_PROBS, nb.float64),
         view2(t, A_SPIKES, nb.int64), view2(t, A_ACTIVE, nb.uint8))


@nb.njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def tick_batch_parallel(order, starts, slots, ticks, state_f, enc, wf, wi, dims, coef, enc_par,
                        steps, work_f, work_i, work_z, probs, spikes, active):
    """Like :func:`tick_batch`, the batch split into ``len(starts) - 1`` chunks run in parallel.

    ``order[starts[c]:starts[c + 1]]`` are the batch positions of chunk c, in arrival
    order; every tick of one market must fall in the same chunk. ``work_*`` have one
    row per chunk.
    """
    for c in nb.prange(starts.shape[0] - 1):
        _run(order, slots, starts[c], starts[c + 1], True, ticks, state_f, enc, wf, wi, dims, coef, enc_par, steps,
             work_f[c], work_i[c], work_z[c], probs, spikes, active)


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _run(order, slots, lo, hi, use_order, ticks, state_f, enc, wf, wi, dims, coef, enc_par, steps,
         work_f, work_i, work_z, probs, spikes, active):
    """Process batch positions ``order[lo:hi]`` (or ``lo:hi`` when not ``use_order``)."""
    M, G, D, P, N, K, NNZ, S = dims[D_M], dims[D_G], dims[D_DEN], dims[D_P], dims[D_N], dims[D_K], dims[D_NNZ], dims[D_SLOTS]
    v_gr, i_gr, golgi, v_pc, i_pc, v_dcn, i_dcn, v_out, i_out = state_views(state_f, S, G, P, N, K, rows_of)
    # Segments where PackedLayout put them (their starts are in dims).
    o = dims[D_MG_W]
    mg_w = rows_of(wf, o, D, G)
    o = dims[D_PF_W]
    pf_w = wf[o:o + NNZ]
    o = dims[D_PC_BIAS]
    pc_bias = wf[o:o + P]
    o = dims[D_W_MD_T]
    w_md_t = rows_of(wf, o, M, N)
    o = dims[D_W_PD_T]
    w_pd_t = rows_of(wf, o, P, N)
    o = dims[D_DCN_BIAS]
    dcn_bias = wf[o:o + N]
    o = dims[D_W_OUT]
    w_out = rows_of(wf, o, K, N)
    dense = dims[D_DENSE] != 0
    o = dims[D_PF_ROWS]
    pf_rows = rows_of(wf, o, G if dense else 0, P)
    # Indices are read unsigned: numba then skips its negative-index wraparound on every use.
    wiu = wi.view(np.uint32)
    o = dims[D_MG_IDX]
    mg_idx = rows_of(wiu, o, D, G)
    o = dims[D_PF_PTR]
    pf_ptr = wiu[o:o + G + 1]
    o = dims[D_PF_POST]
    pf_post = wiu[o:o + NNZ]

    o = 0
    mossy_blk = rows_of(work_f, o, LANES, M)  # mossy currents of up to LANES ticks, one row each
    o += LANES * M
    mossy_t = work_f[o:o + M * LANES]  # the same, transposed (M, LANES), flat
    o += M * LANES
    mf_blk = work_f[o:o + G * LANES]  # granule input of those ticks (G, LANES), flat
    o += G * LANES
    drive_blk = work_f[o:o + N * LANES]  # DCN mossy drive of those ticks (N, LANES), flat
    o += N * LANES
    mf_gr = work_f[o:o + G]
    o += G
    pc_acc = work_f[o:o + P]
    o += P
    drive = work_f[o:o + N]
    o += N
    inh = work_f[o:o + N]
    o += N
    out_in = work_f[o:o + K]
    o += K
    tmp = work_f[o:o + 2]
    W = flag_words(G)
    gr_flag = work_i[0:2 * W].view(np.uint8)  # granule spike flags, one byte per cell (8 cells a 64-bit word)
    WP = flag_words(P)
    pc_flag = work_i[2 * W:2 * W + 2 * WP].view(np.uint8)  # the same for the Purkinje cells
    o = 2 * W + 2 * WP
    spk = work_i.view(np.uint32)  # spike lists, unsigned as the indices above
    gr_spk = spk[o:o + G]
    pc_spk = spk[o + G:o + G + P]
    dcn_spk = spk[o + G + P:o + G + P + N]

    zero = coef[C_N_GRANULE] - coef[C_N_GRANULE]
    c_gr, n_gr, l_gr = coef[C_GR + C_MEM], coef[C_GR + C_SYN], coef[C_GR + C_LEAK]
    t_gr, r_gr = coef[C_GR + C_TH], coef[C_GR + C_RESET]
    c_pc, n_pc, l_pc = coef[C_PC + C_MEM], coef[C_PC + C_SYN], coef[C_PC + C_LEAK]
    t_pc, r_pc = coef[C_PC + C_TH], coef[C_PC + C_RESET]
    c_dn, n_dn, l_dn = coef[C_DN + C_MEM], coef[C_DN + C_SYN], coef[C_DN + C_LEAK]
    t_dn, r_dn = coef[C_DN + C_TH], coef[C_DN + C_RESET]
    c_ro, n_ro, l_ro = coef[C_RO + C_MEM], coef[C_RO + C_SYN], coef[C_RO + C_LEAK]
    rate, target, n_granule, scale = coef[C_GOLGI_RATE], coef[C_TARGET], coef[C_N_GRANULE], coef[C_READOUT_SCALE]
    decay, base = coef[C_GOLGI_DECAY], coef[C_GOLGI_BASE]

    for j0 in range(lo, hi, LANES):
        # Ticks are taken LANES at a time: all of them encoded first (encoder state does not
        # depend on neuron state, and a market's ticks are still encoded in order), then their
        # granule inputs computed side by side, then each stepped through the network in order.
        nt = min(LANES, hi - j0)
        for q in range(nt):
            b = order[j0 + q] if use_order else j0 + q
            encode_tick_to_mossy(enc[slots[b]], ticks[0, b], ticks[1, b], ticks[2, b], enc_par, work_z, mossy_blk[q])
        lanes = nt >= LANES_MIN
        if lanes:
            _granule_input_lanes(mossy_blk, mossy_t, mg_w, mg_idx, mf_blk)
            _dcn_drive_lanes(mossy_t, w_md_t, zero, drive_blk)
        for q in range(nt):
            b = order[j0 + q] if use_order else j0 + q
            s = slots[b]
            mossy = mossy_blk[q]
            if lanes:
                for g in range(G):
                    mf_gr[g] = mf_blk[g * LANES + q]
                for n in range(N):
                    drive[n] = drive_blk[n * LANES + q]
            else:
                _granule_input(mossy, mg_w, mg_idx, mf_gr)
                # Mossy-major so the N sums run side by side; each still adds m = 0..M-1 in order.
                for n in range(N):
                    drive[n] = zero
                for m in range(M):
                    x = mossy[m]  # a local: a load the compiler cannot move past stores into drive
                    w_row = w_md_t[m]
                    for n in range(N):
                        drive[n] += w_row[n] * x
            for n in range(N):
                drive[n] += dcn_bias[n]
            g_inh = golgi[s]
            vg, ig = v_gr[s], i_gr[s]
            vp, ip = v_pc[s], i_pc[s]
            vd, idn = v_dcn[s], i_dcn[s]
            vo, io = v_out[s], i_out[s]
            act = active[b]
            for g in range(G):
                act[g] = 0
            tot_gr = 0
            tot_pc = 0
            tot_dn = 0
            for _ in range(steps):
                # Granule cells: dense, branch-free LIF update (vectorises); spikes flagged.
                for g in range(G):
                    gr_flag[g] = _lif_cell(vg, ig, g, mf_gr[g] - g_inh, c_gr, n_gr, l_gr, t_gr, r_gr)
                cnt = _list_flagged(gr_flag, gr_spk)
                for g in range(G):
                    act[g] |= gr_flag[g]
                # Golgi homeostasis: relu(decay * g + base + rate * (activity - target)).
                tmp[0] = cnt
                g_new = g_inh * decay + base + rate * (tmp[0] / n_granule - target)
                g_inh = g_new if g_new > zero else zero

                # Purkinje cells: parallel-fibre input from the granule cells that spiked only.
                for p in range(P):
                    pc_acc[p] = zero
                if dense:
                    # Four spikes' rows per pass over pc_acc (added in spike order, as one at a time would):
                    # a quarter of the per-row loop overhead and of pc_acc's loads and stores.
                    k = 0
                    while k + 4 <= cnt:
                        r0, r1 = pf_rows[gr_spk[k]], pf_rows[gr_spk[k + 1]]
                        r2, r3 = pf_rows[gr_spk[k + 2]], pf_rows[gr_spk[k + 3]]
                        for p in range(P):
                            pc_acc[p] = (((pc_acc[p] + r0[p]) + r1[p]) + r2[p]) + r3[p]
                        k += 4
                    while k < cnt:
                        row = pf_rows[gr_spk[k]]
                        for p in range(P):
                            pc_acc[p] += row[p]
                        k += 1
                else:
                    for k in range(cnt):
                        g = gr_spk[k]
                        for e in range(pf_ptr[g], pf_ptr[g + 1]):
                            pc_acc[pf_post[e]] += pf_w[e]
                # Flagged like the granule cells, then listed ascending.
                for p in range(P):
                    pc_flag[p] = _lif_cell(vp, ip, p, pc_acc[p] + pc_bias[p], c_pc, n_pc, l_pc, t_pc, r_pc)
                pcnt = _list_flagged(pc_flag, pc_spk)

                # Deep nuclei: mossy drive minus Purkinje inhibition from the cells that spiked,
                # one weight row per spike (the N sums side by side, each in spike order).
                for n in range(N):
                    inh[n] = zero
                for k in range(pcnt):
                    row_pd = w_pd_t[pc_spk[k]]
                    for n in range(N):
                        inh[n] += row_pd[n]
                dcnt = 0
                for n in range(N):  # listed without a branch (see _list_flagged)
                    fired = _lif_cell(vd, idn, n, drive[n] - inh[n], c_dn, n_dn, l_dn, t_dn, r_dn)
                    dcn_spk[dcnt] = n
                    dcnt += int(fired)

                # Readout: leaky integrators of the class groups' DCN spikes.
                for c in range(K):
                    acc = zero
                    for k in range(dcnt):
                        acc += w_out[c, dcn_spk[k]]
                    out_in[c] = acc
                for c in range(K):
                    i_jump = io[c] + out_in[c]
                    v = vo[c]
                    vo[c] = v + c_ro * ((l_ro - v) + i_jump)
                    io[c] = i_jump + n_ro * i_jump
                tot_gr += cnt
                tot_pc += pcnt
                tot_dn += dcnt
            golgi[s] = g_inh
            # Softmax of the logits (scale * v_out, rounded to the network's float type) in float64.
            for c in range(K):
                tmp[1] = scale * vo[c]
                probs[b, c] = tmp[1]
            softmax_row(probs[b])
            spikes[b, 0] = tot_gr
            spikes[b, 1] = tot_pc
            spikes[b, 2] = tot_dn


@nb.njit(cache=True, nogil=True, inline="always")
def flag_words(granule):
    """64-bit words holding one flag byte per granule cell."""
    return (granule + 7) >> 3


def work_i_size(shape: NetworkShape) -> int:
    """Int32 entries of one thread's ``work_i`` row: the granule and Purkinje flag words, then the spike lists of
    the granule, Purkinje and DCN cells, padded to an even count so every row starts 8-byte aligned."""
    n = 2 * flag_words(shape.granule) + 2 * flag_words(shape.purkinje) + shape.granule + shape.purkinje + shape.dcn
    return n + n % 2


@dataclass
class FusedWorkspace:
    """Preallocated scratch (one row per thread) and output buffers for batches up to ``max_batch``.

    ``work_f`` (network float type): mossy currents of LANES ticks and their transpose,
    their granule inputs and DCN drives, one tick's granule input, Purkinje input, DCN drive
    and inhibition, readout input, two temporaries. ``work_i`` (int32, :func:`work_i_size`):
    the granule and Purkinje spike flags as bytes in 64-bit words, then the spike lists. ``work_z``
    (float64): the encoder's three features.
    """

    work_f: np.ndarray
    work_i: np.ndarray
    work_z: np.ndarray
    probs: np.ndarray
    spikes: np.ndarray
    active: np.ndarray

    @classmethod
    def allocate(cls, shape: NetworkShape, dtype: np.dtype, max_batch: int, threads: int = 1) -> FusedWorkspace:
        """Buffers sized for ``shape`` in float type ``dtype``."""
        nf = (2 * LANES * shape.mossy + (LANES + 1) * shape.granule + shape.purkinje + (LANES + 2) * shape.dcn
              + shape.classes + 2)
        return cls(
            work_f=np.zeros((threads, nf), dtype=dtype),
            work_i=np.zeros((threads, work_i_size(shape)), dtype=np.int32),
            work_z=np.zeros((threads, 3), dtype=np.float64),
            probs=np.zeros((max_batch, shape.classes), dtype=np.float64),
            spikes=np.zeros((max_batch, 3), dtype=np.int64),
            active=np.zeros((max_batch, shape.granule), dtype=np.uint8),
        )


def chunk_by_slot(slots: np.ndarray, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """Split a batch into ``chunks`` groups by ``slot % chunks`` (a market never spans two groups).

    Returns (order, starts): positions grouped by chunk, arrival order kept within a chunk.
    """
    key = slots % chunks
    order = np.argsort(key, kind="stable")
    starts = np.searchsorted(key[order], np.arange(chunks + 1)).astype(np.int64)
    return order.astype(np.int64), starts
