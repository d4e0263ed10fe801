"""The scale-out tools import neither numpy nor the network: they run on a load balancer's host too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("numpy", "numba", "torch", "cerebellar_norse.observability.debugtools", "cerebellar_norse.neurons")
PROBE = f"""
import sys
import cerebellar_norse.scaleout.cli
import cerebellar_norse.scaleout.rebalance
import cerebellar_norse.httpcalls
print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))
"""


def test_importing_the_scale_out_cli_and_rebalance_loads_nothing_heavy() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
