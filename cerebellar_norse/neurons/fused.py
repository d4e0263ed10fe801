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
per-argument dispatch cost (~40 ns each) is a large part of a single-tick call.

Batch entries are processed in order, so several ticks of one market in the same
batch are applied in arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from .encoder import encode_tick_to_mossy
from .parameters import C_GOLGI_BASE, C_GOLGI_DECAY, C_GOLGI_RATE, C_N_GRANULE, C_READOUT_SCALE, C_TARGET, NetworkShape
from .state import state_views
from .topology import Weights

# dims layout (int64): sizes of the network and the slot count
D_M, D_G, D_DEN, D_P, D_N, D_K, D_NNZ, D_SLOTS, D_DENSE = range(9)
N_DIMS = 9
# Networks with at most this many granule x Purkinje pairs also get the parallel-fibre
# weights as dense rows (zeros where no synapse): adding a spiking cell's whole row is
# vectorised and avoids the store-forwarding stalls of scattered adds, with the same
# sum per Purkinje cell in the same order (x + 0 = x).
DENSE_PF_MAX = 4_000_000


@dataclass(frozen=True)
class PackedWeights:
    """Weights flattened for the kernel.

    ``wf`` (float): mg_w (D, G) | pf_w in CSR order (nnz) | pc_bias (P) | w_md transposed (M, N) |
    w_pd (N, P) | dcn_bias (N) | w_out (K, N).
    ``wi`` (int32): mg_idx (D, G) | pf_ptr (G + 1) | pf_post (nnz).
    With ``dense``, ``wf`` ends with the parallel-fibre weights as dense rows (G, P).
    """

    wf: np.ndarray
    wi: np.ndarray
    dense: bool

    @classmethod
    def pack(cls, w: Weights, dtype: np.dtype) -> PackedWeights:
        """Pack ``w`` (any float type) into the kernel layout in ``dtype``."""
        if w.pf_ptr[-1] >= 2**31:
            raise ValueError("more than 2^31 parallel-fibre synapses are not supported by the CPU kernel")
        s = w.shape
        parts = [np.asarray(a, dtype=dtype).reshape(-1) for a in (w.mg_w.T, w.pf_w_csr(), w.pc_bias, w.w_md.T, w.w_pd,
                                                                   w.dcn_bias, w.w_out)]
        dense = s.granule * s.purkinje <= DENSE_PF_MAX
        if dense:
            rows = np.zeros((s.granule, s.purkinje), dtype=dtype)
            rows[w.pf_pre.reshape(-1), np.repeat(np.arange(s.purkinje), s.pf_per_purkinje)] = w.pf_w.reshape(-1)
            parts.append(rows.reshape(-1))
        wi = np.concatenate([w.mg_idx.T.reshape(-1), w.pf_ptr, w.pf_post]).astype(np.int32)
        return cls(np.concatenate(parts), wi, dense)

    def dense_offset(self, shape: NetworkShape) -> int:
        """Start of the dense parallel-fibre rows in ``wf``."""
        s = shape
        nnz = s.purkinje * s.pf_per_purkinje
        return s.dendrites * s.granule + nnz + s.purkinje + s.mossy * s.dcn + s.dcn * s.purkinje + s.dcn + s.classes * s.dcn


def make_dims(shape: NetworkShape, slots: int) -> np.ndarray:
    """The int64 dims array of the kernel."""
    d = np.zeros(N_DIMS, dtype=np.int64)
    d[D_M], d[D_G], d[D_DEN], d[D_P], d[D_N], d[D_K] = shape.mossy, shape.granule, shape.dendrites, shape.purkinje, shape.dcn, shape.classes
    d[D_NNZ] = shape.purkinje * shape.pf_per_purkinje
    d[D_SLOTS] = slots
    d[D_DENSE] = int(shape.granule * shape.purkinje <= DENSE_PF_MAX)
    return d


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _lif_cell(v_arr, i_arr, k, inp, c_mem, nc_syn, v_leak, v_th, v_reset):
    """One Norse LIF feed-forward step of cell ``k`` in place; True when it spiked.

    ``i += inp; v += c_mem * ((v_leak - v) + i); i += nc_syn * i; spike and reset at v > v_th``
    with ``c_mem = dt * tau_mem_inv`` and ``nc_syn = -dt * tau_syn_inv`` (the granule layer
    inlines the same update in a branch-free loop).
    """
    i_new = i_arr[k] + inp
    v = v_arr[k]
    v_dec = v + c_mem * ((v_leak - v) + i_new)
    i_arr[k] = i_new + nc_syn * i_new
    if v_dec > v_th:
        v_arr[k] = v_reset
        return True
    v_arr[k] = v_dec
    return False


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


@nb.njit(cache=True, nogil=True, error_model="numpy")
def tick_batch(slots, ticks, state_f, enc, wf, wi, dims, coef, enc_par, steps,
               work_f, work_i, work_z, probs, spikes, active):
    """Step ``len(slots)`` market ticks through ``steps`` integration steps each, in order.

    Args:
        slots: (B,) int64 state slot of each tick.
        ticks: (3, B) float64 rows price, volume, time (ms since epoch).
        state_f: flat float state buffer of the slot arrays (see neurons.state).
        enc: (S, 12) float64 encoder states.
        wf, wi: packed weights (see PackedWeights).
        dims: int64 sizes (see make_dims).
        coef: kernel coefficients (see neurons.parameters.kernel_coefficients).
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
    M, G, D, P, N, K, NNZ, S = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], dims[7]
    v_gr, i_gr, golgi, v_pc, i_pc, v_dcn, i_dcn, v_out, i_out = state_views(state_f, S, G, P, N, K)
    o = 0
    mg_w = wf[o:o + D * G].reshape((D, G))
    o += D * G
    pf_w = wf[o:o + NNZ]
    o += NNZ
    pc_bias = wf[o:o + P]
    o += P
    w_md_t = wf[o:o + M * N].reshape((M, N))
    o += N * M
    w_pd = wf[o:o + N * P].reshape((N, P))
    o += N * P
    dcn_bias = wf[o:o + N]
    o += N
    w_out = wf[o:o + K * N].reshape((K, N))
    o += K * N
    dense = dims[8] != 0
    pf_rows = wf[o:o + G * P].reshape((G, P)) if dense else wf[0:0].reshape((0, P))
    mg_idx = wi[0:D * G].reshape((D, G))
    pf_ptr = wi[D * G:D * G + G + 1]
    pf_post = wi[D * G + G + 1:D * G + G + 1 + NNZ]

    o = 0
    mossy = work_f[o:o + M]
    o += M
    mf_gr = work_f[o:o + G]
    o += G
    pc_acc = work_f[o:o + P]
    o += P
    drive = work_f[o:o + N]
    o += N
    out_in = work_f[o:o + K]
    o += K
    tmp = work_f[o:o + 2]
    gr_flag = work_i[0:G]
    gr_spk = work_i[G:2 * G]
    pc_spk = work_i[2 * G:2 * G + P]
    dcn_spk = work_i[2 * G + P:2 * G + P + N]

    zero = coef[C_N_GRANULE] - coef[C_N_GRANULE]
    c_gr, n_gr, l_gr, t_gr, r_gr = coef[0], coef[1], coef[2], coef[3], coef[4]
    c_pc, n_pc, l_pc, t_pc, r_pc = coef[5], coef[6], coef[7], coef[8], coef[9]
    c_dn, n_dn, l_dn, t_dn, r_dn = coef[10], coef[11], coef[12], coef[13], coef[14]
    c_ro, n_ro, l_ro = coef[15], coef[16], coef[17]
    rate, target, n_granule, scale = coef[C_GOLGI_RATE], coef[C_TARGET], coef[C_N_GRANULE], coef[C_READOUT_SCALE]
    decay, base = coef[C_GOLGI_DECAY], coef[C_GOLGI_BASE]

    for j in range(lo, hi):
        b = order[j] if use_order else j
        s = slots[b]
        encode_tick_to_mossy(enc[s], ticks[0, b], ticks[1, b], ticks[2, b], enc_par, work_z, mossy)
        # Dendrite-major loops vectorise (gathers); the sum order per cell is d = 0..D-1,
        # i.e. ascending mossy index, as in the reference's dense product.
        for g in range(G):
            mf_gr[g] = mg_w[0, g] * mossy[mg_idx[0, g]]
        for d in range(1, D):
            for g in range(G):
                mf_gr[g] += mg_w[d, g] * mossy[mg_idx[d, g]]
        # Mossy-major so the N sums run side by side; each still adds m = 0..M-1 in order.
        for n in range(N):
            drive[n] = zero
        for m in range(M):
            for n in range(N):
                drive[n] += w_md_t[m, n] * mossy[m]
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
                i_new = ig[g] + (mf_gr[g] - g_inh)
                v = vg[g]
                v_dec = v + c_gr * ((l_gr - v) + i_new)
                ig[g] = i_new + n_gr * i_new
                fired = v_dec > t_gr
                gr_flag[g] = fired
                vg[g] = r_gr if fired else v_dec
            cnt = 0
            for g in range(G):  # branch-free compaction: spikes are too sparse and random to predict
                gr_spk[cnt] = g
                cnt += gr_flag[g]
            for k in range(cnt):
                act[gr_spk[k]] = 1
            # Golgi homeostasis: relu(decay * g + base + rate * (activity - target)).
            tmp[0] = cnt
            g_new = g_inh * decay + base + rate * (tmp[0] / n_granule - target)
            g_inh = g_new if g_new > zero else zero

            # Purkinje cells: parallel-fibre input from the granule cells that spiked only.
            for p in range(P):
                pc_acc[p] = zero
            if dense:
                for k in range(cnt):
                    row = pf_rows[gr_spk[k]]
                    for p in range(P):
                        pc_acc[p] += row[p]
            else:
                for k in range(cnt):
                    g = gr_spk[k]
                    for e in range(pf_ptr[g], pf_ptr[g + 1]):
                        pc_acc[pf_post[e]] += pf_w[e]
            pcnt = 0
            for p in range(P):
                if _lif_cell(vp, ip, p, pc_acc[p] + pc_bias[p], c_pc, n_pc, l_pc, t_pc, r_pc):
                    pc_spk[pcnt] = p
                    pcnt += 1

            # Deep nuclei: mossy drive minus Purkinje inhibition from the cells that spiked.
            dcnt = 0
            for n in range(N):
                acc = zero
                for k in range(pcnt):
                    acc += w_pd[n, pc_spk[k]]
                if _lif_cell(vd, idn, n, drive[n] - acc, c_dn, n_dn, l_dn, t_dn, r_dn):
                    dcn_spk[dcnt] = n
                    dcnt += 1

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


@dataclass
class FusedWorkspace:
    """Preallocated scratch (one row per thread) and output buffers for batches up to ``max_batch``."""

    work_f: np.ndarray
    work_i: np.ndarray
    work_z: np.ndarray
    probs: np.ndarray
    spikes: np.ndarray
    active: np.ndarray

    @classmethod
    def allocate(cls, shape: NetworkShape, dtype: np.dtype, max_batch: int, threads: int = 1) -> FusedWorkspace:
        """Buffers sized for ``shape`` in float type ``dtype``."""
        nf = shape.mossy + shape.granule + shape.purkinje + shape.dcn + shape.classes + 2
        return cls(
            work_f=np.zeros((threads, nf), dtype=dtype),
            work_i=np.zeros((threads, 2 * shape.granule + shape.purkinje + shape.dcn), dtype=np.int32),
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
