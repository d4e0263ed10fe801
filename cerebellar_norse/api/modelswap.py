"""Activating a stored model in a running service (hot swap between batches)."""

from __future__ import annotations

import logging

from ..errors import CheckpointError, InputError
from ..training.checkpoints import ModelStore, shape_mismatch
from .deps import ServiceState

log = logging.getLogger("cerebellar_norse.models")


class ModelNotFoundError(InputError):
    """No stored model of that version (HTTP 404)."""

    status_code = 404


def activate_version(state: ServiceState, store: ModelStore, version: str) -> None:
    """Verify ``version`` and make it the served model.

    Runs on the event loop thread, where batches run, so the swap falls between two
    batches: every response is computed entirely with the old or the new weights.
    """
    if version not in store.versions():
        raise ModelNotFoundError(f"no stored model {version!r}", "version")
    model = store.load(version)  # CheckpointError for a corrupt one: nothing changes
    bad = shape_mismatch(model.neural, state.cfg.neural)
    if bad:
        raise CheckpointError(f"model {version} does not fit the running network ({', '.join(bad)} differ)", str(model.path))
    eng = state.engine
    old = eng.model_version
    eng.set_weights(model.weights, model.version, reset_states=state.cfg.training.reset_state_on_swap)
    store.set_active(model.version)
    log.info("model activated", extra={"fields": {"model_version": model.version, "previous": old,
                                                   "reset_states": state.cfg.training.reset_state_on_swap}})
