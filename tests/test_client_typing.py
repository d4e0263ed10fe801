"""The client as a type-checked trading program sees it: the names the documentation imports from
``cerebellar_norse.client`` are exported, and results are typed (``py.typed`` is shipped)."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

import cerebellar_norse.client as client_module

ROOT = Path(__file__).resolve().parent.parent

USER_SCRIPT = '''
from cerebellar_norse.client import BatchPartError, Client, Health, OutcomeUnknownError, TickAnswer
from cerebellar_norse.errors import CapacityError, InputError


def run(url: str) -> float:
    with Client(url, timeout_s=1.0, retries=2) as c:
        r: TickAnswer = c.process({"price": 1.0, "volume": 2.0, "timestamp": 1, "market_id": "A"})
        up: float = r["probabilities"]["up"]
        h: Health = c.health()
        state: str = h["status"]
        queued: int = h.get("queue_depth", 0)
        try:
            rs = c.process_batch([{"price": 1.0, "volume": 2.0, "timestamp": 1, "market_id": "A"}])
        except BatchPartError as e:
            first = e.results[0]
            spikes: int = first["spike_count"] if first is not None else 0
            return spikes + up + queued
        except OutcomeUnknownError as e:
            return len(e.market_id + state)
        except CapacityError as e:
            return e.retry_after_s
        except InputError as e:
            return e.status_code
        return rs[0]["prediction"] + up
'''


def test_every_name_the_documentation_takes_from_the_client_module_is_exported() -> None:
    """``mypy --strict`` (no implicit re-export) refuses ``from cerebellar_norse.client import X`` of a name the
    module only imports: the documented ones must be in its ``__all__``."""
    texts = [ROOT.joinpath("README.md").read_text(encoding="utf-8"),
             *(p.read_text(encoding="utf-8") for p in sorted(ROOT.joinpath("docs").glob("*.md")))]
    named = {m for text in texts for m in re.findall(r"cerebellar_norse\.client\.([A-Za-z_]\w*)", text)}
    named |= {n.strip() for text in texts for line in re.findall(r"from cerebellar_norse\.client import ([\w, ]+)", text)
              for n in line.split(",")}
    assert {"Client", "OutcomeUnknownError", "BatchPartError"} <= named
    assert named <= set(client_module.__all__), named - set(client_module.__all__)
    assert all(hasattr(client_module, n) for n in client_module.__all__)


@pytest.mark.slow
def test_a_trading_script_using_the_client_passes_mypy_strict(tmp_path: Path) -> None:
    """What a trading developer writes type-checks under ``--strict`` with the results and errors typed."""
    from mypy import api

    script = tmp_path / "trading.py"
    script.write_text(textwrap.dedent(USER_SCRIPT), encoding="utf-8")
    settings = tmp_path / "mypy.ini"  # the user's own settings (none), not this project's
    settings.write_text("[mypy]\n", encoding="utf-8")
    limit = sys.getrecursionlimit()
    try:
        # the package's own modules are followed silently: found from the checkout or installed, the errors asked
        # for are the script's (what its imports and results type as), not the package's under the user's --strict
        out, err, status = api.run(["--strict", "--follow-imports=silent", "--no-error-summary", "--config-file",
                                    str(settings), "--cache-dir", str(tmp_path / "cache"), str(script)])
    finally:  # mypy raises the interpreter's recursion limit for good; later tests of deep inputs rely on the default
        sys.setrecursionlimit(limit)
    assert status == 0, out + err
