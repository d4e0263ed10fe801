"""Fused, event-driven numba kernel of the cerebellar network (CPU fast path).

Implements exactly the equations of :mod:`cerebellar_norse.neurons.functional`
(Norse's ``lif_feed_forward_step``/``li_feed_forward_step``), with the same order of
floating point operations where it matters:

* encoder, granule, Golgi, Purkinje, DCN and readout updates fused in one call that
  steps a whole batch of markets through ``steps_per_tick`` steps;
* parallel-fibre input is event-driven: only the CSR rows of granule cells that
  spiked are read (``pf_ptr``/``pf_post``/``pf_w_csr``), so the cost of that layer is
  proportional to the spikes, not to granule_size x Purkinje cells;
* no allocation: states are updated in place in the slot arrays, scratch space comes
  from preallocated buffers (:class:`FusedWorkspace`).

Batch entries are processed in order, so several ticks of one market in the same
batch are applied in arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from .encoder import encode_tick_to_mossy
from .parameters import C_GOLGI_RATE, C_N_GRANULE, C_READOUT_SCALE, C_TARGET, NetworkShape


@nb.njit(cache=True, nogil=True, inline="always")
def _lif(v, i, inp, c_mem, nc_syn, v_leak, v_th, v_reset):  # type: ignore[no-untyped-def]
    """One Norse LIF feed-forward step of one cell: returns (spiked, v, i)."""
    i_new = i + inp
    v_dec = v + c_mem * ((v_leak - v) + i_new)
    i_dec = i_new + nc_syn * i_new
    if v_dec > v_th:
        return True, v_reset, i_dec
    return False, v_dec, i_dec


@nb.njit(cache=True, nogil=True)
def tick_batch(slots, price, volume, ts_ms,  # type: ignore[no-untyped-def]
               enc, v_gr, i_gr, golgi, v_pc, i_pc, v_dcn, i_dcn, v_out, i_out,
               mg_idx, mg_w, pf_ptr, pf_post, pf_w, pc_bias, w_md, w_pd, dcn_bias, w_out,
               coef, enc_par, steps, work_f, work_i, work_z, probs, spikes):
    """Step ``len(slots)`` market ticks through ``steps`` integration steps each.

    Args:
        slots: (B,) int64 state slot of each tick.
        price, volume, ts_ms: (B,) float64 tick fields (ts in ms since epoch).
        enc … i_out: slot state arrays (see neurons.state.StateArrays), updated in place.
        mg_idx … w_out: weights (see neurons.topology.Weights; pf_w in CSR order).
        coef: kernel coefficients (see neurons.parameters.kernel_coefficients).
        enc_par: float64 encoder parameters.
        steps: integration steps per tick.
        work_f, work_i, work_z: scratch buffers (see FusedWorkspace).
        probs: (B, K) float64 output class probabilities.
        spikes: (B, 3) int64 output spikes per population over the tick.
    """
    G, D = mg_idx.shape
    P = pc_bias.shape[0]
    N = dcn_bias.shape[0]
    K = w_out.shape[0]
    M = w_md.shape[1]
    mossy = work_f[0:M]
    mf_gr = work_f[M:M + G]
    pc_acc = work_f[M + G:M + G + P]
    drive = work_f[M + G + P:M + G + P + N]
    out_in = work_f[M + G + P + N:M + G + P + N + K]
    tmp = work_f[M + G + P + N + K:M + G + P + N + K + 2]
    gr_spk = work_i[0:G]
    pc_spk = work_i[G:G + P]
    dcn_spk = work_i[G + P:G + P + N]
    zero = coef[C_N_GRANULE] - coef[C_N_GRANULE]
    c_gr, n_gr, l_gr, t_gr, r_gr = coef[0], coef[1], coef[2], coef[3], coef[4]
    c_pc, n_pc, l_pc, t_pc, r_pc = coef[5], coef[6], coef[7], coef[8], coef[9]
    c_dn, n_dn, l_dn, t_dn, r_dn = coef[10], coef[11], coef[12], coef[13], coef[14]
    c_ro, n_ro, l_ro = coef[15], coef[16], coef[17]
    rate, target, n_granule, scale = coef[C_GOLGI_RATE], coef[C_TARGET], coef[C_N_GRANULE], coef[C_READOUT_SCALE]

    for b in range(slots.shape[0]):
        s = slots[b]
        encode_tick_to_mossy(enc[s], price[b], volume[b], ts_ms[b], enc_par, work_z, mossy)
        for g in range(G):
            acc = zero
            for d in range(D):
                acc += mg_w[g, d] * mossy[mg_idx[g, d]]
            mf_gr[g] = acc
        for n in range(N):
            acc = zero
            for m in range(M):
                acc += w_md[n, m] * mossy[m]
            drive[n] = acc + dcn_bias[n]
        g_inh = golgi[s]
        tot_gr = 0
        tot_pc = 0
        tot_dn = 0
        vg = v_gr[s]
        ig = i_gr[s]
        for _ in range(steps):
            cnt = 0
            for g in range(G):
                z, vg[g], ig[g] = _lif(vg[g], ig[g], mf_gr[g] - g_inh, c_gr, n_gr, l_gr, t_gr, r_gr)
                if z:
                    gr_spk[cnt] = g
                    cnt += 1
            tmp[0] = cnt
            g_new = g_inh + rate * (tmp[0] / n_granule - target)
            g_inh = g_new if g_new > zero else zero

            for p in range(P):
                pc_acc[p] = zero
            for k in range(cnt):
                g = gr_spk[k]
                for e in range(pf_ptr[g], pf_ptr[g + 1]):
                    pc_acc[pf_post[e]] += pf_w[e]
            pcnt = 0
            for p in range(P):
                z, v_pc[s, p], i_pc[s, p] = _lif(v_pc[s, p], i_pc[s, p], pc_acc[p] + pc_bias[p], c_pc, n_pc, l_pc, t_pc, r_pc)
                if z:
                    pc_spk[pcnt] = p
                    pcnt += 1

            dcnt = 0
            for n in range(N):
                acc = zero
                for k in range(pcnt):
                    acc += w_pd[n, pc_spk[k]]
                z, v_dcn[s, n], i_dcn[s, n] = _lif(v_dcn[s, n], i_dcn[s, n], drive[n] - acc, c_dn, n_dn, l_dn, t_dn, r_dn)
                if z:
                    dcn_spk[dcnt] = n
                    dcnt += 1

            for c in range(K):
                acc = zero
                for k in range(dcnt):
                    acc += w_out[c, dcn_spk[k]]
                out_in[c] = acc
            for c in range(K):
                i_jump = i_out[s, c] + out_in[c]
                v = v_out[s, c]
                v_out[s, c] = v + c_ro * ((l_ro - v) + i_jump)
                i_out[s, c] = i_jump + n_ro * i_jump
            tot_gr += cnt
            tot_pc += pcnt
            tot_dn += dcnt
        golgi[s] = g_inh
        # softmax of the logits in float64
        mx = -np.inf
        for c in range(K):
            tmp[1] = scale * v_out[s, c]
            probs[b, c] = tmp[1]
            if probs[b, c] > mx:
                mx = probs[b, c]
        tot = 0.0
        for c in range(K):
            probs[b, c] = np.exp(probs[b, c] - mx)
            tot += probs[b, c]
        for c in range(K):
            probs[b, c] /= tot
        spikes[b, 0] = tot_gr
        spikes[b, 1] = tot_pc
        spikes[b, 2] = tot_dn


@dataclass
class FusedWorkspace:
    """Preallocated scratch and output buffers of the kernel for batches up to ``max_batch``."""

    work_f: np.ndarray
    work_i: np.ndarray
    work_z: np.ndarray
    probs: np.ndarray
    spikes: np.ndarray

    @classmethod
    def allocate(cls, shape: NetworkShape, dtype: np.dtype, max_batch: int) -> FusedWorkspace:
        """Buffers sized for ``shape`` in float type ``dtype``."""
        nf = shape.mossy + shape.granule + shape.purkinje + shape.dcn + shape.classes + 2
        return cls(
            work_f=np.zeros(nf, dtype=dtype),
            work_i=np.zeros(shape.granule + shape.purkinje + shape.dcn, dtype=np.int32),
            work_z=np.zeros(3, dtype=np.float64),
            probs=np.zeros((max_batch, shape.classes), dtype=np.float64),
            spikes=np.zeros((max_batch, 3), dtype=np.int64),
        )
