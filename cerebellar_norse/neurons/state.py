"""Market state arrays: one contiguous slot array per state variable.

A batch gathers and scatters market states by slot index; the fused kernel works on
these arrays in place. Shapes: S slots, G granule, P Purkinje, N DCN, K classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from .. import kernelcache  # noqa: F401  (installs the guard: a failed write of numba's cache is no error)
from .encoder import N_ENC_STATE
from .native import reshaped
from .parameters import NetworkParameters, numpy_dtype

STATE_FIELDS = ("enc", "v_gr", "i_gr", "golgi", "v_pc", "i_pc", "v_dcn", "i_dcn", "v_out", "i_out")
FLOAT_FIELDS = STATE_FIELDS[1:]


def floats_per_slot(G: int, P: int, N: int, K: int) -> int:
    """Float values of one slot's network state."""
    return 2 * G + 1 + 2 * P + 2 * N + 2 * K


@nb.njit(cache=True, nogil=True)
def state_views(state_f, S, G, P, N, K, as_rows):
    """The per-variable slot arrays as views of one flat buffer (one contiguous block each).

    Order: v_gr (S, G), i_gr (S, G), golgi (S,), v_pc, i_pc (S, P), v_dcn, i_dcn (S, N),
    v_out, i_out (S, K). ``as_rows(a, start, rows, cols)`` makes the 2-D views
    (:func:`~cerebellar_norse.neurons.native.reshaped` outside kernels).
    """
    o = 0
    v_gr = as_rows(state_f, o, S, G)
    o += S * G
    i_gr = as_rows(state_f, o, S, G)
    o += S * G
    golgi = state_f[o:o + S]
    o += S
    v_pc = as_rows(state_f, o, S, P)
    o += S * P
    i_pc = as_rows(state_f, o, S, P)
    o += S * P
    v_dcn = as_rows(state_f, o, S, N)
    o += S * N
    i_dcn = as_rows(state_f, o, S, N)
    o += S * N
    v_out = as_rows(state_f, o, S, K)
    o += S * K
    i_out = as_rows(state_f, o, S, K)
    return v_gr, i_gr, golgi, v_pc, i_pc, v_dcn, i_dcn, v_out, i_out


@dataclass(frozen=True)
class StateArrays:
    """Per-slot network and encoder state (the arrays are changed in place, never rebound:
    kernels hold their addresses).

    Attributes:
        enc: (S, 12) float64 encoder normaliser state (see neurons.encoder).
        v_gr, i_gr: (S, G) granule membrane potential and synaptic current.
        golgi: (S,) Golgi inhibition (current per step).
        v_pc, i_pc: (S, P) Purkinje potential and current.
        v_dcn, i_dcn: (S, N) deep-nuclei potential and current.
        v_out, i_out: (S, K) readout leaky-integrator potential and current.
    """

    enc: np.ndarray
    flat: np.ndarray
    v_gr: np.ndarray
    i_gr: np.ndarray
    golgi: np.ndarray
    v_pc: np.ndarray
    i_pc: np.ndarray
    v_dcn: np.ndarray
    i_dcn: np.ndarray
    v_out: np.ndarray
    i_out: np.ndarray

    @classmethod
    def allocate(cls, slots: int, p: NetworkParameters, precision: str, touch: bool = True) -> StateArrays:
        """Zeroed arrays for ``slots`` markets.

        With ``touch`` every page is written now, so the memory is really reserved and a
        market's first tick does not pay the page faults (np.zeros alone maps lazily).
        """
        s = p.shape
        n = slots * floats_per_slot(s.granule, s.purkinje, s.dcn, s.classes)
        flat = np.empty(n, dtype=numpy_dtype(precision)) if touch else np.zeros(n, dtype=numpy_dtype(precision))
        enc = np.empty((slots, N_ENC_STATE)) if touch else np.zeros((slots, N_ENC_STATE))
        if touch:
            flat.fill(0)
            enc.fill(0)
        # The layout's Python code with numpy's reshape (one call at start, nothing to compile). Calling the compiled
        # state_views from Python with a dispatcher argument made numba key its cache by that dispatcher's identity,
        # new in every process: each start added a variant to the cache index, and once it held more than numba's
        # FUNCTION_CACHE_SIZE (128) the index could not be saved again (ReferenceError): every later start failed.
        views = state_views.py_func(flat, slots, s.granule, s.purkinje, s.dcn, s.classes, reshaped.py_func)
        return cls(enc, flat, *views)

    @property
    def slots(self) -> int:
        """Number of slots."""
        return int(self.enc.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held by all arrays."""
        return int(self.enc.nbytes + self.flat.nbytes)

    def reset_slot(self, slot: int, p: NetworkParameters, golgi_init: float) -> None:
        """Put ``slot`` in the resting state (a market's first tick starts from here)."""
        self.enc[slot] = 0.0
        self.v_gr[slot] = float(p.granule.v_leak)
        self.i_gr[slot] = 0.0
        self.golgi[slot] = golgi_init
        self.v_pc[slot] = float(p.purkinje.v_leak)
        self.i_pc[slot] = 0.0
        self.v_dcn[slot] = float(p.dcn.v_leak)
        self.i_dcn[slot] = 0.0
        self.v_out[slot] = float(p.readout.v_leak)
        self.i_out[slot] = 0.0

    def read_slot(self, slot: int) -> dict[str, np.ndarray]:
        """A copy of one slot's state, keyed by STATE_FIELDS."""
        return {name: np.array(getattr(self, name)[slot], copy=True) for name in STATE_FIELDS}

    def write_slot(self, slot: int, snapshot: dict[str, np.ndarray]) -> None:
        """Load a snapshot (from :meth:`read_slot`) into ``slot``; shapes are checked first."""
        for name in STATE_FIELDS:
            arr = getattr(self, name)
            got = snapshot.get(name)
            if got is None or np.shape(got) != arr.shape[1:]:
                raise ValueError(f"snapshot field {name!r} missing or of shape {None if got is None else np.shape(got)}, expected {arr.shape[1:]}")
        for name in STATE_FIELDS:
            getattr(self, name)[slot] = snapshot[name]
