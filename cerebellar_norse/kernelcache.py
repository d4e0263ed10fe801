"""numba's cache of compiled kernels (``NUMBA_CACHE_DIR``): a write of it that fails is no error.

numba compiles a kernel at its first call, registers the compiled code, then saves it to the cache directory; a
save that fails (a full disk, ENOSPC; a quota used up, EDQUOT; an I/O error) was raised out of that first call. At
start the service then refused every stored model as one that "cannot be served", and stopped with
``cannot start: writing failed at <state dir>: No space left on device``, naming a directory that was not full. The
cache only saves compiling again at the next start: a save that fails is said once at WARNING (the directory, the
errno) and the kernel runs as compiled. The cache's files are written to a temporary file and renamed, so a failed
save leaves no damaged entry.

Importing this module installs the guard (once per process); each module defining kernels with ``cache=True``
imports it, so it is in place before any of them compiles.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from numba.core import caching

from .errors import StorageError

log = logging.getLogger("cerebellar_norse.kernels")

_lock = threading.Lock()
_said = False


def _failed_save(cache: Any, exc: OSError) -> None:
    """Say (once per process) that the compiled kernels' cache cannot be written."""
    global _said
    with _lock:
        if _said:
            return
        _said = True
    where = getattr(cache, "_cache_path", None) or exc.filename or "NUMBA_CACHE_DIR"
    log.warning("cannot write the compiled kernels' cache %s: %s; the kernels run as compiled, without it (the next "
                "start compiles them again, which takes longer): free space there, or set NUMBA_CACHE_DIR to a "
                "writable directory; said once", where, StorageError.os_reason(exc),
                extra={"fields": {"path": str(where), "errno": exc.errno}})


def install() -> None:
    """Make numba's ``Cache.save_overload`` keep a kernel whose cache entry cannot be written (idempotent)."""
    save = caching.Cache.save_overload
    if getattr(save, "_cerebellar_norse_guard", False):
        return

    def save_overload(self: Any, sig: Any, data: Any) -> None:
        try:
            save(self, sig, data)
        except OSError as exc:
            _failed_save(self, exc)

    save_overload._cerebellar_norse_guard = True  # type: ignore[attr-defined]
    caching.Cache.save_overload = save_overload  # type: ignore[method-assign]


install()
