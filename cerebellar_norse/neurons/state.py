"""Market state arrays: one contiguous slot array per state variable.

A batch gathers and scatters market states by slot index; the fused kernel works on
these arrays in place. Shapes: S slots, G granule, P Purkinje, N DCN, K classes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .encoder import N_ENC_STATE
from .parameters import NetworkParameters, numpy_dtype

STATE_FIELDS = ("enc", "v_gr", "i_gr", "golgi", "v_pc", "i_pc", "v_dcn", "i_dcn", "v_out", "i_out")


@dataclass
class StateArrays:
    """Per-slot network and encoder state.

    Attributes:
        enc: (S, 12) float64 encoder normaliser state (see neurons.encoder).
        v_gr, i_gr: (S, G) granule membrane potential and synaptic current.
        golgi: (S,) Golgi inhibition (current per step).
        v_pc, i_pc: (S, P) Purkinje potential and current.
        v_dcn, i_dcn: (S, N) deep-nuclei potential and current.
        v_out, i_out: (S, K) readout leaky-integrator potential and current.
    """

    enc: np.ndarray
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
    def allocate(cls, slots: int, p: NetworkParameters, precision: str) -> StateArrays:
        """Zeroed arrays for ``slots`` markets (touched, so the memory is really reserved)."""
        s, dt = p.shape, numpy_dtype(precision)
        z = lambda *shape: np.zeros(shape, dtype=dt)  # noqa: E731
        return cls(np.zeros((slots, N_ENC_STATE)), z(slots, s.granule), z(slots, s.granule), z(slots),
                   z(slots, s.purkinje), z(slots, s.purkinje), z(slots, s.dcn), z(slots, s.dcn),
                   z(slots, s.classes), z(slots, s.classes))

    @property
    def slots(self) -> int:
        """Number of slots."""
        return int(self.enc.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held by all arrays."""
        return sum(getattr(self, f.name).nbytes for f in fields(self))

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays in kernel argument order (STATE_FIELDS)."""
        return tuple(getattr(self, name) for name in STATE_FIELDS)

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
            if name not in snapshot or np.shape(snapshot[name]) != arr.shape[1:]:
                raise ValueError(f"snapshot field {name!r} missing or of shape {np.shape(snapshot.get(name))}, expected {arr.shape[1:]}")
        for name in STATE_FIELDS:
            getattr(self, name)[slot] = snapshot[name]
