"""The cerebellar network as pure functions over Norse primitives (the reference).

One integration step, for a batch of markets, with mossy currents ``m`` fixed over
the tick (units: dimensionless current jumps per step, threshold 1):

.. math::
    \\begin{align*}
    I_{gr} &= W_{mg} m - g \\\\
    z_{gr}, s_{gr} &= \\mathrm{LIF}_{gr}(I_{gr}, s_{gr}) \\\\
    g &\\leftarrow \\max(0,\\; (1 - \\lambda) g + \\lambda g_0 + \\eta (\\bar z_{gr} - \\rho)) \\quad \\text{(Golgi; } \\lambda = \\text{golgi\\_leak},\\ g_0 = \\text{golgi\\_init)} \\\\
    z_{pc}, s_{pc} &= \\mathrm{LIF}_{pc}(W_{pf}^\\top z_{gr} + b_{pc}, s_{pc}) \\\\
    z_{dcn}, s_{dcn} &= \\mathrm{LIF}_{dcn}(W_{md} m + b_{dcn} - W_{pd} z_{pc}, s_{dcn}) \\\\
    v_{out}, s_{out} &= \\mathrm{LI}_{out}(W_{out} z_{dcn}, s_{out})
    \\end{align*}

where LIF is ``norse.torch.functional.lif.lif_feed_forward_step`` (membrane
``dv/dt = (v_leak - v + i)/tau_mem``, synapse ``di/dt = -i/tau_syn``, jump
``i += input``, spike and reset at ``v > v_th``) and LI is Norse's
``li_feed_forward_step``. The class logits after ``steps_per_tick`` steps are
``readout_scale * v_out`` (down, flat, up). Spikes use Norse's SuperSpike surrogate
gradient, so the whole tick is differentiable for training.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from norse.torch.functional.leaky_integrator import LIState, li_feed_forward_step
from norse.torch.functional.lif import LIFFeedForwardState, lif_feed_forward_step

from .parameters import NetworkParameters


class CerebellumState(NamedTuple):
    """Network state of a batch of markets (leading dimension B).

    Attributes:
        granule: LIF state, v and i of shape (B, G).
        golgi: Golgi inhibition current per step, shape (B, 1).
        purkinje: LIF state (B, P).
        dcn: LIF state (B, N).
        readout: leaky-integrator state (B, K).
    """

    granule: LIFFeedForwardState
    golgi: torch.Tensor
    purkinje: LIFFeedForwardState
    dcn: LIFFeedForwardState
    readout: LIState


class CerebellumWeights(NamedTuple):
    """Dense weights of the reference (zeros where no synapse exists).

    Attributes:
        w_mg: (G, M) mossy -> granule.
        w_pf: (G, P) parallel fibres, granule -> Purkinje.
        pc_bias: (P,) tonic Purkinje drive.
        w_md: (N, M) mossy collaterals -> DCN.
        w_pd: (N, P) Purkinje -> DCN inhibition magnitudes.
        dcn_bias: (N,) tonic DCN drive.
        w_out: (K, N) DCN -> readout.
    """

    w_mg: torch.Tensor
    w_pf: torch.Tensor
    pc_bias: torch.Tensor
    w_md: torch.Tensor
    w_pd: torch.Tensor
    dcn_bias: torch.Tensor
    w_out: torch.Tensor


class TickOutput(NamedTuple):
    """Result of one tick for a batch.

    Attributes:
        logits: (B, K) class logits (down, flat, up).
        spikes: (B, 3) spikes per population (granule, Purkinje, DCN) over the tick.
    """

    logits: torch.Tensor
    spikes: torch.Tensor


def initial_state(batch: int, p: NetworkParameters, golgi_init: float) -> CerebellumState:
    """Resting state: potentials at v_leak, currents 0, Golgi inhibition at its calibrated start."""
    s, dt = p.shape, p.dtype

    def lif(n: int, lp: object) -> LIFFeedForwardState:
        v = torch.full((batch, n), float(lp.v_leak), dtype=dt)  # type: ignore[attr-defined]
        return LIFFeedForwardState(v=v, i=torch.zeros(batch, n, dtype=dt))

    return CerebellumState(
        granule=lif(s.granule, p.granule),
        golgi=torch.full((batch, 1), golgi_init, dtype=dt),
        purkinje=lif(s.purkinje, p.purkinje),
        dcn=lif(s.dcn, p.dcn),
        readout=LIState(v=torch.full((batch, s.classes), float(p.readout.v_leak), dtype=dt), i=torch.zeros(batch, s.classes, dtype=dt)),
    )


def cerebellum_step(mf_gr: torch.Tensor, drive_dcn: torch.Tensor, state: CerebellumState, w: CerebellumWeights,
                    p: NetworkParameters) -> tuple[torch.Tensor, torch.Tensor, CerebellumState]:
    """One integration step of the whole network.

    Args:
        mf_gr: (B, G) mossy drive of granule cells, ``m @ w_mg.T`` (per step).
        drive_dcn: (B, N) excitatory DCN drive, ``m @ w_md.T + dcn_bias`` (per step).
        state: network state before the step.
        w: weights.
        p: parameters (dt in s).

    Returns:
        (v_out, spikes (B, 3), new state).
    """
    z_gr, gr = lif_feed_forward_step(mf_gr - state.golgi, state.granule, p.granule, p.dt)
    activity = z_gr.mean(dim=1, keepdim=True)
    golgi = torch.relu(state.golgi * p.golgi_decay + p.golgi_base + p.golgi_rate * (activity - p.target_sparsity))
    z_pc, pc = lif_feed_forward_step(z_gr @ w.w_pf + w.pc_bias, state.purkinje, p.purkinje, p.dt)
    z_dcn, dcn = lif_feed_forward_step(drive_dcn - z_pc @ w.w_pd.T, state.dcn, p.dcn, p.dt)
    v_out, ro = li_feed_forward_step(z_dcn @ w.w_out.T, state.readout, p.readout, p.dt)
    spikes = torch.stack([z_gr.sum(dim=1), z_pc.sum(dim=1), z_dcn.sum(dim=1)], dim=1)
    return v_out, spikes, CerebellumState(gr, golgi, pc, dcn, ro)


def cerebellum_tick(mossy: torch.Tensor, state: CerebellumState, w: CerebellumWeights,
                    p: NetworkParameters) -> tuple[TickOutput, CerebellumState]:
    """One market tick: ``steps_per_tick`` steps with the tick's mossy currents ``mossy`` (B, M)."""
    mf_gr = mossy @ w.w_mg.T
    drive_dcn = mossy @ w.w_md.T + w.dcn_bias
    spikes = torch.zeros(mossy.shape[0], 3, dtype=mossy.dtype)
    v_out = state.readout.v
    for _ in range(p.steps_per_tick):
        v_out, z, state = cerebellum_step(mf_gr, drive_dcn, state, w, p)
        spikes = spikes + z
    return TickOutput(logits=p.readout_scale * v_out, spikes=spikes), state
