"""Starting again and again must not grow numba's cache index until it can no longer be saved.

``StateArrays.allocate`` once called the compiled ``state_views`` from Python with a
dispatcher argument; numba keys such a variant by that dispatcher's identity, new in every
process, so each start compiled and added one more variant to the cache index, and once it
held more than numba's ``FUNCTION_CACHE_SIZE`` (128 by default) of them saving the index
raised ``ReferenceError: underlying object has vanished``: every later start failed.
A cache size of 2 shows it within a few starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
from cerebellar_norse.config import load_config
from cerebellar_norse.neurons.parameters import network_parameters
from cerebellar_norse.neurons.state import StateArrays
cfg = load_config(None)
a = StateArrays.allocate(3, network_parameters(cfg, 0.1), cfg.neural.precision)
a.v_gr[1, 2] = 5.0
assert a.flat.sum() == 5.0  # the views are views of the flat buffer
import os
os._exit(0)  # numba saved its index when it compiled; the interpreter's teardown would only cost a second
"""


def test_repeated_starts_share_a_numba_cache(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, CEREBELLAR_NORSE_NUMBA_CACHE_BASE=str(tmp_path), NUMBA_FUNCTION_CACHE_SIZE="2",
               PYTHONPATH=str(root))
    for start in range(4):
        r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"start {start + 1} failed: {r.stderr[-2000:]}"
    variants = list(tmp_path.glob("*/neurons_*/state.state_views-*.nbc"))
    assert len(variants) <= 1, [p.name for p in variants]


def test_a_child_given_the_keyed_directory_uses_it_as_it_is(tmp_path: Path) -> None:
    """A process started with its parent's environment less the ``CEREBELLAR_NORSE_`` variables (as services are by
    their tests and benchmarks) shares the parent's cache: it does not nest a second keyed directory inside."""
    root = Path(__file__).resolve().parents[2]
    show = "import os, cerebellar_norse; print(os.environ['NUMBA_CACHE_DIR'])"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CEREBELLAR_NORSE_", "NUMBA_CACHE_DIR"))}
    first = subprocess.run([sys.executable, "-c", show], env=dict(env, NUMBA_CACHE_DIR=str(tmp_path)), cwd=root,
                           capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    assert Path(first).parent == tmp_path
    child = subprocess.run([sys.executable, "-c", show], env=dict(env, NUMBA_CACHE_DIR=first), cwd=root,
                           capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    assert child == first
