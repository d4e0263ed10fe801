"""Activating a stored model in a running service (hot swap between batches)."""

from __future__ import annotations

import contextlib
import logging

from ..config import NeuralConfig
from ..errors import (
    HOST_SHORTAGE_ERRNOS,
    CapacityError,
    CheckpointError,
    ModelNotFoundError,
    ModelUnreadableError,
    StorageError,
)
from ..observability import systemd
from ..storage import atomic_write_bytes, fsync_dir
from ..training.archive import STORE_RETRY_AFTER_S
from ..training.checkpoints import ACTIVE, ModelStore, StoredModel, shape_mismatch
from .deps import ServiceState
from .errors import HOST_SHORTAGE_RETRY_S
from .lifecycle import serving_status

log = logging.getLogger("cerebellar_norse.models")



def activate_version(state: ServiceState, store: ModelStore, version: str) -> None:
    """Verify ``version`` and make it the served model (:func:`verified_model`, then :func:`swap_in`)."""
    swap_in(state, store, verified_model(store, version, state.cfg.neural))


def verified_model(store: ModelStore, version: str, neural: NeuralConfig) -> StoredModel:
    """Stored model ``version``, checksums verified and shape compared with ``neural``; reads files only.

    Safe in a worker thread: a large model is read and hashed off the event loop.
    Raises :class:`~cerebellar_norse.errors.ModelNotFoundError`,
    :class:`~cerebellar_norse.errors.CheckpointError` (field ``version``) for a corrupt one
    or one of another network shape, or :class:`~cerebellar_norse.errors.CapacityError`
    (503 ``capacity``, ``Retry-After``) when a file of it could not be read for want of a
    file descriptor or memory (EMFILE, ENFILE, ENOMEM, EAGAIN): the host's, not the model's.
    """
    if version not in store.versions():
        raise ModelNotFoundError(f"no stored model {version!r}", "version")
    try:
        model = store.load(version)  # CheckpointError for a corrupt one: nothing changes
        bad = shape_mismatch(model.neural, neural)
        if bad:
            raise CheckpointError(f"model {version} does not fit the running network ({', '.join(bad)} differ)",
                                  str(model.path))
    except ModelUnreadableError as exc:
        if exc.errno in HOST_SHORTAGE_ERRNOS:  # no descriptor or memory for now: nothing is wrong with the model
            raise CapacityError(f"model {version} cannot be read now: {exc}: the host is short of file descriptors or "
                                "memory; nothing was changed: activate it again", retry_after_s=HOST_SHORTAGE_RETRY_S) from None
        exc.field = "version"
        raise
    except CheckpointError as exc:
        exc.field = "version"  # the request's one input: the version in the path
        raise
    return model


def swap_in(state: ServiceState, store: ModelStore, model: StoredModel) -> None:
    """Make a verified ``model`` the served one.

    Runs on the event loop thread, where batches run, so the swap falls between two
    batches: every response is computed entirely with the old or the new weights.
    ``models/ACTIVE`` is written before the swap: when it cannot be written the served model is
    unchanged: no room or a read-only disk is a :class:`~cerebellar_norse.errors.CapacityError`
    (503 ``capacity`` with ``Retry-After``, as a model upload's: the service itself is fine),
    another failure a :class:`~cerebellar_norse.errors.StorageError` (503 ``engine``).
    """
    eng = state.engine
    old = eng.model_version
    try:  # ACTIVE as it is, byte for byte (even unreadable as a version), to put back if the swap is refused
        before: bytes | None = (store.root / ACTIVE).read_bytes()
    except FileNotFoundError:
        before = None
    except OSError:  # (a directory, say): the swap may go ahead; its undo leaves ACTIVE as the swap left it
        before = b""
    try:  # first, so that a model served is always the one a restart serves
        store.set_active(model.version)
    except OSError as exc:
        err = StorageError.from_os_error("cannot write", store.root / ACTIVE, exc)
        if StorageError.is_write_failure(exc):  # no room or a read-only disk: activate it again once there is room
            raise CapacityError(f"{err}; nothing was changed: make room in the state dir and activate it again",
                                retry_after_s=STORE_RETRY_AFTER_S) from None
        raise err from None
    try:
        eng.set_weights(model.weights, model.version, reset_states=state.cfg.training.reset_state_on_swap)
    except BaseException:  # not swapped (Engine.set_weights undid it): ACTIVE names what is served again
        with contextlib.suppress(OSError):  # the swap's own error is the one to report
            if before is None:
                (store.root / ACTIVE).unlink(missing_ok=True)
                fsync_dir(store.root)
            elif before:
                atomic_write_bytes(store.root / ACTIVE, before)
        raise
    state.degraded = None  # the operator chose the served model: a fallback or a lost market state is resolved
    systemd.status(serving_status(state))  # systemctl status names the model served
    log.info("model activated", extra={"fields": {"model_version": model.version, "previous": old,
                                                   "reset_states": state.cfg.training.reset_state_on_swap}})
