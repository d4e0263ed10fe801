"""cerebellar-norse: a low-latency cerebellar spiking neural network for market ticks."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"


def _versioned_numba_cache() -> None:
    """Point numba's on-disk cache at a directory keyed by a hash of this package's sources.

    numba invalidates a cached kernel only when its own file changes, not when a function
    it calls from another module does; keying the directory by every source file makes a
    changed or upgraded package compile afresh instead of running stale machine code.

    It also turns on LLVM's SLP vectoriser (``NUMBA_SLP_VECTORIZE``, off in numba by
    default) unless the environment says otherwise: the kernel's eight-tick granule
    inputs are written lane by lane for it to pack into one vector operation. It changes
    no result (it packs identical operations, no reordering); the setting is part of the
    cache key.
    """
    slp = os.environ.setdefault("NUMBA_SLP_VECTORIZE", "1")
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    digest.update(f"slp={slp}".encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    key = digest.hexdigest()[:16]
    inherited = os.environ.get("NUMBA_CACHE_DIR")
    if inherited and os.path.basename(os.path.normpath(inherited)) == key:
        # a child process started with this process's environment less its CEREBELLAR_NORSE_ variables: the
        # directory is already keyed (nested under itself, every kernel would be compiled afresh there)
        inherited = os.path.dirname(os.path.normpath(inherited))
    base = os.environ.get("CEREBELLAR_NORSE_NUMBA_CACHE_BASE") or inherited or str(root / "__pycache__" / "numba")
    os.environ["CEREBELLAR_NORSE_NUMBA_CACHE_BASE"] = base
    cache_dir = os.path.join(base, key)
    os.environ["NUMBA_CACHE_DIR"] = cache_dir
    import sys

    if "numba" in sys.modules:  # imported before us: numba reads the setting at decoration time
        sys.modules["numba"].config.CACHE_DIR = cache_dir
        sys.modules["numba"].config.SLP_VECTORIZE = int(slp)


_versioned_numba_cache()

if TYPE_CHECKING:
    from .config import Config, load_config
    from .neurons.network import CerebellarNetwork

__all__ = ["CerebellarNetwork", "Config", "__version__", "load_config"]


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (e.g. for the CLI's config checks) must not load torch.
    if name == "CerebellarNetwork":
        from .neurons.network import CerebellarNetwork

        return CerebellarNetwork
    if name in ("Config", "load_config"):
        from . import config

        return getattr(config, name)
    raise AttributeError(name)
