"""Topology and initial weights, generated from the config and its ``seed``.

Generation uses one ``numpy.random.Generator(PCG64(seed))`` with a fixed order of
draws, so the same config gives the same network bit for bit. Weights are drawn in
float64 and rounded to the network's precision, so a float32 and a float64 network
of the same seed share their topology.

Connectivity (all fixed except the trainable weights named in :data:`TRAINABLE`):

* mossy -> granule: each granule cell gets ``granule_dendrites`` distinct mossy
  fibres (``mg_idx``) with excitatory weights ``mg_w``.
* granule -> Purkinje (parallel fibres): each Purkinje cell gets
  ``connections_per_neuron`` distinct granule cells (``pf_pre``, sorted) with weights
  ``pf_w``. The fused kernel walks the same synapses by presynaptic granule cell
  (CSR: ``pf_ptr``, ``pf_post``, ``pf_src``), which makes it event-driven.
* mossy -> DCN (collaterals, ``w_md``, excitatory), Purkinje -> DCN (``w_pd``,
  inhibitory magnitudes), DCN -> readout (``w_out``, one row per class).
* the calibrated output head (``head_gain``, ``head_bias``, float64, one per class):
  served probabilities are ``softmax(head_gain * log p + head_bias)`` of the network's
  probabilities ``p``; gains 1 and biases 0 (a generated network) leave ``p`` unchanged.
  Training fits them on the validation split (see ``training.calibration``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from ..config import Config
from .encoder import population_code
from .parameters import NetworkShape, network_shape, numpy_dtype

TRAINABLE = ("pf_w", "pc_bias", "w_md", "w_pd", "dcn_bias", "w_out")
# The weight layers by name, for reports (name -> Weights attribute); HEAD_LAYERS are the calibrated head.
LAYERS = {
    "mossy_granule": "mg_w",
    "parallel_fibre_purkinje": "pf_w",
    "purkinje_bias": "pc_bias",
    "mossy_dcn": "w_md",
    "purkinje_dcn": "w_pd",
    "dcn_bias": "dcn_bias",
    "dcn_readout": "w_out",
}
HEAD_LAYERS = {"head_gain": "head_gain", "head_bias": "head_bias"}
CALIBRATION_SAMPLES = 256
CALIBRATION_CELLS = 4096


@dataclass
class Weights:
    """Connectivity and weights of one network (numpy arrays, network float type).

    Shapes: G granule, M mossy, P Purkinje, C inputs per Purkinje, N DCN, K classes.
    """

    mg_idx: np.ndarray  # (G, D) int32 mossy fibre of each dendrite
    mg_w: np.ndarray  # (G, D) dendrite weights
    pf_pre: np.ndarray  # (P, C) int32 granule cell of each parallel-fibre synapse
    pf_w: np.ndarray  # (P, C) parallel-fibre weights
    pc_bias: np.ndarray  # (P,) tonic Purkinje drive per step
    w_md: np.ndarray  # (N, M) mossy collateral -> DCN
    w_pd: np.ndarray  # (N, P) Purkinje -> DCN inhibition (>= 0)
    dcn_bias: np.ndarray  # (N,) tonic DCN drive per step
    w_out: np.ndarray  # (K, N) DCN -> class readout
    golgi_init: float  # initial Golgi inhibition (current per step)
    pf_ptr: np.ndarray  # (G+1,) int64 CSR row pointers by granule cell
    pf_post: np.ndarray  # (C*P,) int32 Purkinje cell of each CSR entry
    pf_src: np.ndarray  # (C*P,) int64 flat index into pf_w of each CSR entry
    head_gain: np.ndarray = field(default_factory=lambda: np.ones(3))  # (K,) float64 calibrated head gains
    head_bias: np.ndarray = field(default_factory=lambda: np.zeros(3))  # (K,) float64 calibrated head biases

    @property
    def shape(self) -> NetworkShape:
        """Population sizes implied by the arrays."""
        g, d = self.mg_idx.shape
        p, c = self.pf_pre.shape
        return NetworkShape(self.w_md.shape[1], g, p, self.w_md.shape[0], self.w_out.shape[0], d, c)

    def pf_w_csr(self) -> np.ndarray:
        """Parallel-fibre weights in CSR (presynaptic) order, for the fused kernel."""
        return np.ascontiguousarray(self.pf_w.reshape(-1)[self.pf_src])

    def astype(self, dtype: np.dtype) -> Weights:
        """A copy with float arrays in ``dtype`` (index arrays shared)."""
        f = lambda a: np.ascontiguousarray(a, dtype=dtype)  # noqa: E731
        return Weights(self.mg_idx, f(self.mg_w), self.pf_pre, f(self.pf_w), f(self.pc_bias), f(self.w_md), f(self.w_pd),
                       f(self.dcn_bias), f(self.w_out), self.golgi_init, self.pf_ptr, self.pf_post, self.pf_src,
                       self.head_gain, self.head_bias)

    def copy(self) -> Weights:
        """A deep copy of every array."""
        return Weights(self.mg_idx.copy(), self.mg_w.copy(), self.pf_pre.copy(), self.pf_w.copy(), self.pc_bias.copy(),
                       self.w_md.copy(), self.w_pd.copy(), self.dcn_bias.copy(), self.w_out.copy(), self.golgi_init,
                       self.pf_ptr.copy(), self.pf_post.copy(), self.pf_src.copy(), self.head_gain.copy(), self.head_bias.copy())

    def with_head(self, gain: np.ndarray, bias: np.ndarray) -> Weights:
        """The same network with another calibrated head (arrays shared, head copied as float64)."""
        return replace(self, head_gain=np.array(gain, dtype=np.float64), head_bias=np.array(bias, dtype=np.float64))

    @property
    def head_is_identity(self) -> bool:
        """True when the head leaves the network's probabilities unchanged."""
        return bool(np.all(self.head_gain == 1.0) and np.all(self.head_bias == 0.0))


def _distinct_rows(rng: np.random.Generator, n_rows: int, k: int, n: int) -> np.ndarray:
    """``n_rows`` rows of ``k`` distinct integers in [0, n), vectorised by redrawing duplicate rows."""
    out = rng.integers(0, n, size=(n_rows, k), dtype=np.int64)
    while True:
        s = np.sort(out, axis=1)
        bad = np.nonzero((s[:, 1:] == s[:, :-1]).any(axis=1))[0] if k > 1 else np.array([], dtype=np.int64)
        if bad.size == 0:
            return out
        out[bad] = rng.integers(0, n, size=(bad.size, k), dtype=np.int64)


def _csr_by_granule(pf_pre: np.ndarray, n_granule: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    c = pf_pre.shape[1]
    flat_pre = pf_pre.reshape(-1).astype(np.int64)
    src = np.argsort(flat_pre, kind="stable")
    post = (src // c).astype(np.int32)
    counts = np.bincount(flat_pre, minlength=n_granule)
    ptr = np.zeros(n_granule + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, post, src.astype(np.int64)


def generate_weights(cfg: Config) -> Weights:
    """The network of ``cfg``: topology and initial weights from ``cfg.neural.seed``."""
    n = cfg.neural
    s = network_shape(n)
    rng = np.random.Generator(np.random.PCG64(n.seed))
    per_feature = s.mossy // 3

    mg_idx = np.sort(_distinct_rows(rng, s.granule, s.dendrites, s.mossy), axis=1).astype(np.int32)
    mg_w = rng.uniform(0.5, 1.5, size=(s.granule, s.dendrites))

    pf_pre = np.empty((s.purkinje, s.pf_per_purkinje), dtype=np.int32)
    for p in range(s.purkinje):
        pf_pre[p] = np.sort(rng.choice(s.granule, size=s.pf_per_purkinje, replace=False))
    # Mean parallel-fibre input per step ~ 0.5 threshold currents at target sparsity.
    pf_scale = 1.0 / (s.pf_per_purkinje * n.target_sparsity)
    pf_w = rng.uniform(0.0, 1.0, size=(s.purkinje, s.pf_per_purkinje)) * pf_scale * _threshold_current(n.purkinje, n.dt_ms)
    pc_bias = np.full(s.purkinje, 0.8 * _threshold_current(n.purkinje, n.dt_ms))

    dcn_thr = _threshold_current(n.dcn, n.dt_ms)
    w_md = rng.uniform(0.0, 1.0, size=(s.dcn, s.mossy)) * (2.0 * dcn_thr / (3 * 2.5 * n.mossy_gain))
    w_pd = rng.uniform(0.0, 1.0, size=(s.dcn, s.purkinje)) * (2.0 * dcn_thr / s.purkinje)
    dcn_bias = np.full(s.dcn, 0.5 * dcn_thr)
    group = s.dcn // s.classes
    w_out = np.zeros((s.classes, s.dcn))
    for k in range(s.classes):
        w_out[k, k * group:(k + 1) * group] = 1.0 / group
    w_out += rng.normal(0.0, 0.05 / group, size=w_out.shape)

    golgi_init = _calibrate_golgi(rng, cfg, mg_idx, mg_w, per_feature)
    ptr, post, src = _csr_by_granule(pf_pre, s.granule)
    w = Weights(mg_idx, mg_w, pf_pre, pf_w, pc_bias, w_md, w_pd, dcn_bias, w_out, golgi_init, ptr, post, src)
    return w.astype(numpy_dtype(n.precision))


SEED_VERSION_RE = re.compile(r"seed-(\d+)")  # the untrained network of seed N, served before any model is stored


def seed_version_weights(cfg: Config, version: str) -> Weights | None:
    """The untrained network a model version ``seed-<N>`` names (never stored in ``models/``), regenerated from seed N
    with ``cfg``'s network; None for any other version."""
    m = SEED_VERSION_RE.fullmatch(version)
    if m is None:
        return None
    return generate_weights(cfg.model_copy(update={"neural": cfg.neural.model_copy(update={"seed": int(m.group(1))})}))


def _threshold_current(lif: object, dt_ms: float) -> float:
    """Constant per-step input current that holds a LIF cell at threshold (steady state)."""
    v_th = lif.v_th - lif.v_leak  # type: ignore[attr-defined]
    return float(v_th * dt_ms / lif.tau_syn_ms)  # type: ignore[attr-defined]


def _calibrate_golgi(rng: np.random.Generator, cfg: Config, mg_idx: np.ndarray, mg_w: np.ndarray, per_feature: int) -> float:
    """Initial Golgi inhibition: the input quantile at which ``target_sparsity`` of cells would fire.

    Features are drawn standard normal (clipped) and population coded as the encoder
    does; the Golgi homeostasis then tracks the target from this starting point.
    """
    n = cfg.neural
    z = np.clip(rng.standard_normal((CALIBRATION_SAMPLES, 3)), -n.feature_clip, n.feature_clip)
    mossy = np.stack([population_code(row, per_feature, n.feature_clip, n.mossy_gain) for row in z])
    cells = min(mg_idx.shape[0], CALIBRATION_CELLS)
    drive = (mossy[:, mg_idx[:cells]] * mg_w[:cells]).sum(axis=2)
    q = float(np.quantile(drive, 1.0 - n.target_sparsity))
    return max(0.0, q - _threshold_current(n.granule, n.dt_ms))
