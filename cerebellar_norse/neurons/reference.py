"""The Norse reference network as a thin ``nn.Module`` (used for training and crossval).

Trainable parameters are the weights named in ``topology.TRAINABLE``; the
connectivity (which synapses exist) is fixed by buffers, so training never creates
a synapse: the dense parallel-fibre matrix is rebuilt from the (P, C) weights.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .functional import CerebellumState, CerebellumWeights, TickOutput, cerebellum_tick, initial_state
from .parameters import NetworkParameters
from .topology import Weights


class CerebellarReference(nn.Module):
    """Norse reference of the cerebellar network; ``forward(mossy, state) -> (TickOutput, state)``."""

    def __init__(self, weights: Weights, params: NetworkParameters) -> None:
        super().__init__()
        self.params = params
        dt = params.dtype
        s = weights.shape
        t = lambda a: torch.as_tensor(np.asarray(a), dtype=dt)  # noqa: E731
        w_mg = torch.zeros(s.granule, s.mossy, dtype=dt)
        rows = torch.arange(s.granule).unsqueeze(1).expand(-1, s.dendrites)
        w_mg[rows, torch.as_tensor(weights.mg_idx, dtype=torch.long)] = t(weights.mg_w)
        self.register_buffer("w_mg", w_mg)
        self.register_buffer("pf_pre", torch.as_tensor(weights.pf_pre, dtype=torch.long))
        self.pf_w = nn.Parameter(t(weights.pf_w))
        self.pc_bias = nn.Parameter(t(weights.pc_bias))
        self.w_md = nn.Parameter(t(weights.w_md))
        self.w_pd = nn.Parameter(t(weights.w_pd))
        self.dcn_bias = nn.Parameter(t(weights.dcn_bias))
        self.w_out = nn.Parameter(t(weights.w_out))
        self.golgi_init = float(weights.golgi_init)
        self._template = weights

    def dense_weights(self) -> CerebellumWeights:
        """Dense weights for :func:`cerebellum_tick` (differentiable w.r.t. the parameters)."""
        s = self._template.shape
        post = torch.arange(s.purkinje).unsqueeze(1).expand(-1, s.pf_per_purkinje)
        pre: torch.Tensor = self.pf_pre  # type: ignore[assignment]
        w_mg: torch.Tensor = self.w_mg  # type: ignore[assignment]
        w_pf = torch.zeros(s.granule, s.purkinje, dtype=self.pf_w.dtype).index_put((pre, post), self.pf_w)
        return CerebellumWeights(w_mg, w_pf, self.pc_bias, self.w_md, self.w_pd, self.dcn_bias, self.w_out)

    def initial_state(self, batch: int) -> CerebellumState:
        """Resting state for ``batch`` markets."""
        return initial_state(batch, self.params, self.golgi_init)

    def forward(self, mossy: torch.Tensor, state: CerebellumState,
                weights: CerebellumWeights | None = None) -> tuple[TickOutput, CerebellumState]:
        """One tick for a batch: mossy currents (B, M) -> logits (B, K), spikes (B, 3), new state."""
        return cerebellum_tick(mossy, state, weights if weights is not None else self.dense_weights(), self.params)

    def export_weights(self) -> Weights:
        """The current weights as a :class:`Weights` (for the fused kernel or checkpoints)."""
        w = self._template.copy()
        for name in ("pf_w", "pc_bias", "w_md", "w_pd", "dcn_bias", "w_out"):
            setattr(w, name, getattr(self, name).detach().cpu().numpy().astype(w.pf_w.dtype, copy=True))
        return w
