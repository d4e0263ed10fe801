"""Model archives: one stored model as checksummed bytes, to publish it to other replicas.

An archive is a ``.npz`` (no pickles) holding the bytes of each file of a model
directory (``weights.npz``, ``config.json``, ``metrics.json``, ``manifest.json``) behind
a SHA-256 header (:func:`~cerebellar_norse.storage.seal`). Staging one into a model
store writes it like a trained model (``models/.tmp-…`` then an atomic rename), after
the archive's checksum, every file's manifest checksum, the weights and the network
shape of the receiving service have been verified: a bad archive leaves the store
unchanged.
"""

from __future__ import annotations

import io
import os
import shutil
import threading
from pathlib import Path

import numpy as np

from ..config import Config
from ..errors import CapacityError, CheckpointError, InputError, ModelConflictError, StorageError
from ..storage import atomic_write_bytes, fsync_dir, seal, unseal
from .checkpoints import FILES, MANIFEST, ModelStore, check_version, load_model_dir, parse_manifest, shape_mismatch

MEDIA_TYPE = "application/octet-stream"
STORE_RETRY_AFTER_S = 60.0
"""Retry-After (s) of an upload refused for lack of room: time to free space."""
_STAGING = threading.Lock()


def pack_model(path: Path) -> bytes:
    """The archive of a verified model directory (CheckpointError when it is corrupt)."""
    load_model_dir(path)
    files = {name: np.frombuffer((path / name).read_bytes(), dtype=np.uint8) for name in (*FILES, MANIFEST)}
    buf = io.BytesIO()
    np.savez(buf, **files)  # type: ignore[arg-type]
    return seal(buf.getvalue())


def unpack(data: bytes) -> dict[str, bytes]:
    """The files of an archive (CheckpointError when it is corrupt or incomplete)."""
    payload = unseal(data, "request body")
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as z:
            files = {k: z[k].tobytes() for k in z.files}
    except Exception as exc:
        raise CheckpointError(f"not a model archive ({type(exc).__name__}: {exc})", "request body") from None
    missing = [n for n in (*FILES, MANIFEST) if n not in files]
    if missing:
        raise CheckpointError(f"model archive lacks {missing}", "request body")
    return files


def stage_archive(store: ModelStore, version: str, data: bytes, cfg: Config) -> bool:
    """Store an archive as model ``version`` (not activated); False when the same model is stored already.

    Raises:
        CheckpointError: corrupt archive, or a model that does not fit ``cfg``'s network.
        ModelConflictError: another model is stored under ``version``.
        InputError: the archive's manifest names another version.
        CapacityError: the state dir has no room or is read-only (ENOSPC, EDQUOT, EROFS, EFBIG): nothing stored.
        StorageError: another write failure (permissions, I/O): nothing stored.
    """
    check_version(version)
    files = unpack(data)
    manifest = parse_manifest(files[MANIFEST], f"request body: {MANIFEST}")
    if manifest.get("version") != version:
        raise InputError(f"the archive holds model {manifest.get('version')!r}, not {version!r}", "version")
    with _STAGING:  # one upload at a time: they share the staging directory's name and the check for the final one
        return _store_files(store, version, files, cfg)


def _store_files(store: ModelStore, version: str, files: dict[str, bytes], cfg: Config) -> bool:
    final = store.root / version
    if final.exists():
        if (final / MANIFEST).is_file() and (final / MANIFEST).read_bytes() == files[MANIFEST]:
            load_model_dir(final)
            return False
        raise ModelConflictError(f"another model is stored as {version!r}", "version")
    store.root.mkdir(parents=True, exist_ok=True)
    tmp = store.root / f".tmp-{version}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for name in (*FILES, MANIFEST):
            atomic_write_bytes(tmp / name, files[name])
        try:
            model = load_model_dir(tmp)  # every file's checksum, the weights' shapes
        except CheckpointError as exc:  # named as the archive's file, not as the staging directory's
            name = Path(exc.path).name if Path(exc.path).parent == tmp else ""
            raise CheckpointError(exc.reason, f"request body: {name}" if name else "request body") from None
        bad = shape_mismatch(model.neural, cfg.neural)
        if bad:
            raise CheckpointError(f"model {version} does not fit this service's network ({', '.join(bad)} differ)",
                                  "request body")
        os.rename(tmp, final)
        fsync_dir(store.root)
    except OSError as exc:  # full disk, permissions: named, 503, nothing stored
        err = StorageError.from_os_error("cannot store the model: writing failed at", exc.filename or tmp, exc)
        if StorageError.is_write_failure(exc):  # no room or a read-only disk: the service is fine, the upload can wait
            raise CapacityError(f"{err}; nothing was stored: make room in the state dir and upload it again",
                                retry_after_s=STORE_RETRY_AFTER_S) from None
        raise err from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True
