"""Neuron and network parameters, derived from the configuration.

Units: time constants in the config are in milliseconds; Norse's ``LIFParameters``
take inverse time constants in 1/s and ``dt`` in seconds. Potentials and currents are
dimensionless (threshold 1 by default); input currents are per-step jumps added to
the synaptic current, as in ``norse.torch.functional.lif.lif_feed_forward_step``.

:func:`kernel_coefficients` flattens everything the fused kernel needs into one array
in the network's float type, computed with the same roundings as Norse's expressions
(``dt * tau_mem_inv`` and ``-dt * tau_syn_inv`` as products in that float type).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from norse.torch.functional.leaky_integrator import LIParameters
from norse.torch.functional.lif import LIFParameters

from ..config import N_CLASSES, N_FEATURES, Config, LIFConfig, NeuralConfig
from .layout import (
    C_GOLGI_BASE,
    C_GOLGI_DECAY,
    C_GOLGI_RATE,
    C_LEAK,
    C_LIF_POPULATIONS,
    C_MEM,
    C_N_GRANULE,
    C_READOUT_SCALE,
    C_RESET,
    C_RO,
    C_SYN,
    C_TARGET,
    C_TH,
    N_COEF,
)

POPULATIONS = ("granule", "purkinje", "dcn", "readout")

# Layout of the float64 encoder parameter array.
E_WINDOW, E_CLIP, E_GAIN, E_PER_FEATURE = 0, 1, 2, 3
N_ENC_PAR = 4


class NetworkShape(NamedTuple):
    """Population sizes (cells)."""

    mossy: int
    granule: int
    purkinje: int
    dcn: int
    classes: int
    dendrites: int
    pf_per_purkinje: int


class NetworkParameters(NamedTuple):
    """Everything but the weights: shape, time step, per-population LIF parameters.

    Attributes:
        dt: integration step (s).
        steps_per_tick: integration steps per market tick.
        granule, purkinje, dcn: Norse LIF parameters (inverse time constants in 1/s).
        readout: Norse leaky-integrator parameters of the class readout (1/s).
        golgi_rate: Golgi homeostatic gain (current per unit activity error, per step).
        golgi_decay: fraction of the Golgi inhibition kept per step (1 - ``golgi_leak``).
        golgi_base: ``golgi_leak * golgi_init``: the leak pulls the inhibition toward its
            calibrated start, so the homeostatic fixed point stays at ``target_sparsity``.
        target_sparsity: target fraction of granule cells spiking per step.
        readout_scale: readout potential -> logit multiplier.
    """

    shape: NetworkShape
    dt: float
    steps_per_tick: int
    granule: LIFParameters
    purkinje: LIFParameters
    dcn: LIFParameters
    readout: LIParameters
    golgi_rate: float
    golgi_decay: float
    golgi_base: float
    target_sparsity: float
    readout_scale: float
    dtype: torch.dtype


def torch_dtype(precision: str) -> torch.dtype:
    """``"float32"``/``"float64"`` to the torch dtype."""
    return torch.float32 if precision == "float32" else torch.float64


def numpy_dtype(precision: str) -> np.dtype:
    """``"float32"``/``"float64"`` to the numpy dtype."""
    return np.dtype(np.float32 if precision == "float32" else np.float64)


def _lif(c: LIFConfig, dtype: torch.dtype) -> LIFParameters:
    t = lambda x: torch.as_tensor(x, dtype=dtype)  # noqa: E731
    return LIFParameters(
        tau_syn_inv=t(1000.0 / c.tau_syn_ms),
        tau_mem_inv=t(1000.0 / c.tau_mem_ms),
        v_leak=t(c.v_leak),
        v_th=t(c.v_th),
        v_reset=t(c.v_reset),
        method="super",
        alpha=torch.as_tensor(100.0),
    )


def _li(c: LIFConfig, dtype: torch.dtype) -> LIParameters:
    t = lambda x: torch.as_tensor(x, dtype=dtype)  # noqa: E731
    return LIParameters(tau_syn_inv=t(1000.0 / c.tau_syn_ms), tau_mem_inv=t(1000.0 / c.tau_mem_ms), v_leak=t(c.v_leak))


def network_shape(n: NeuralConfig) -> NetworkShape:
    """Population sizes of a ``[neural]`` section."""
    return NetworkShape(n.mossy_size, n.granule_size, n.purkinje_size, n.dcn_size, N_CLASSES, n.granule_dendrites, n.connections_per_neuron)


def network_parameters(cfg: Config, golgi_init: float = 0.0) -> NetworkParameters:
    """Build the network parameters (Norse objects in the configured precision).

    ``golgi_init`` is the network's calibrated initial Golgi inhibition
    (``Weights.golgi_init``), toward which the Golgi leak relaxes.
    """
    n = cfg.neural
    dt = torch_dtype(n.precision)
    return NetworkParameters(
        shape=network_shape(n),
        dt=n.dt_ms / 1000.0,
        steps_per_tick=n.steps_per_tick,
        granule=_lif(n.granule, dt),
        purkinje=_lif(n.purkinje, dt),
        dcn=_lif(n.dcn, dt),
        readout=_li(n.readout, dt),
        golgi_rate=n.golgi_rate,
        golgi_decay=1.0 - n.golgi_leak,
        golgi_base=n.golgi_leak * golgi_init,
        target_sparsity=n.target_sparsity,
        readout_scale=n.readout_scale,
        dtype=dt,
    )


def kernel_coefficients(p: NetworkParameters) -> np.ndarray:
    """The coefficient array of the fused kernel (layout: the ``C_*`` names of :mod:`.layout`)."""
    npdt = np.float32 if p.dtype == torch.float32 else np.float64
    coef = np.zeros(N_COEF, dtype=npdt)
    # The products are taken in torch, exactly as Norse's step functions form them.
    for base, pop in zip(C_LIF_POPULATIONS, (p.granule, p.purkinje, p.dcn), strict=True):
        coef[base + C_MEM] = (p.dt * pop.tau_mem_inv).item()
        coef[base + C_SYN] = (-p.dt * pop.tau_syn_inv).item()
        coef[base + C_LEAK] = float(pop.v_leak)
        coef[base + C_TH] = float(pop.v_th)
        coef[base + C_RESET] = float(pop.v_reset)
    coef[C_RO + C_MEM] = (p.dt * p.readout.tau_mem_inv).item()
    coef[C_RO + C_SYN] = (-p.dt * p.readout.tau_syn_inv).item()
    coef[C_RO + C_LEAK] = float(p.readout.v_leak)
    coef[C_GOLGI_DECAY] = p.golgi_decay
    coef[C_GOLGI_BASE] = p.golgi_base
    coef[C_GOLGI_RATE] = p.golgi_rate
    coef[C_TARGET] = p.target_sparsity
    coef[C_N_GRANULE] = p.shape.granule
    coef[C_READOUT_SCALE] = p.readout_scale
    return coef


def encoder_parameters(n: NeuralConfig) -> np.ndarray:
    """Float64 parameters of the tick encoder: window (ticks), clip (sd), gain, fibres per feature."""
    enc = np.zeros(N_ENC_PAR, dtype=np.float64)
    enc[E_WINDOW] = n.norm_window
    enc[E_CLIP] = n.feature_clip
    enc[E_GAIN] = n.mossy_gain
    enc[E_PER_FEATURE] = n.mossy_size // N_FEATURES
    return enc
