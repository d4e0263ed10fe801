"""Saving and restoring the live market states of a pool (atomic, checksummed).

The file ``<state_dir>/market_state.bin`` holds an ``.npz`` payload behind a SHA-256
header (see :mod:`cerebellar_norse.storage`): the market ids, their states (one
array per state variable, rows in least-recently-used order) and a fingerprint of
the network (shape, seed, precision, model version). A file whose fingerprint does
not match the running network is not loaded: those states belong to another model.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError
from ..neurons.state import STATE_FIELDS
from ..storage import read_checksummed, write_checksummed
from .pool import StatePool

STATE_FILE = "market_state.bin"


def save_pool(pool: StatePool, path: Path, fingerprint: dict[str, Any]) -> int:
    """Write every live market's state to ``path``; returns the number of markets saved."""
    items = pool.table.items()
    slots = np.array([s for _, s in items], dtype=np.int64)
    arrays = {name: np.ascontiguousarray(getattr(pool.arrays, name)[slots]) for name in STATE_FIELDS}
    buf = io.BytesIO()
    np.savez(buf, markets=np.array([m for m, _ in items], dtype=np.str_),
             fingerprint=np.array(json.dumps(fingerprint, sort_keys=True)), **arrays)  # type: ignore[arg-type]
    write_checksummed(path, buf.getvalue())
    return len(items)


def load_pool(pool: StatePool, path: Path, fingerprint: dict[str, Any]) -> int:
    """Restore markets saved by :func:`save_pool` into an empty pool; returns how many.

    Raises:
        CheckpointError: the file is corrupt, of another network, or of the wrong shape.
            Nothing is loaded in that case.
    """
    payload = read_checksummed(path)
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except Exception as exc:  # a valid checksum over an unreadable npz: written by something else
        raise CheckpointError(f"unreadable state payload: {exc}", str(path)) from None
    try:
        saved_fp = json.loads(str(data["fingerprint"]))
        markets = [str(m) for m in data["markets"]]
    except (KeyError, ValueError, TypeError) as exc:  # TypeError: a 0-d markets array
        raise CheckpointError(f"state file lacks or garbles {exc}", str(path)) from None
    if saved_fp != json.loads(json.dumps(fingerprint, sort_keys=True)):
        raise CheckpointError(f"saved for another network ({saved_fp}), not this one ({fingerprint})", str(path))
    n = len(markets)
    if n > pool.capacity:
        markets = markets[n - pool.capacity:]  # keep the most recently used
    keep = len(markets)
    for name in STATE_FIELDS:
        arr = data.get(name)
        want = (n, *getattr(pool.arrays, name).shape[1:])
        if arr is None or arr.shape != want:
            raise CheckpointError(f"field {name!r} has shape {None if arr is None else arr.shape}, expected {want}", str(path))
    for j, market in enumerate(markets):
        row = n - keep + j
        slot = pool.table.acquire(market)
        pool.arrays.write_slot(slot, {name: data[name][row] for name in STATE_FIELDS})
    return keep
