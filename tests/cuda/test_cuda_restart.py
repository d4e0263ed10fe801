"""Market states on the GPU survive a restart of the service (skipped without CUDA).

Real service processes on CUDA: one serves 40 ticks of five markets, then one more each; another serves the same 40,
is stopped (SIGTERM: the states are copied from the device and saved) or killed (``kill -9``: the journal is replayed
through the CUDA step at the next start), started again and given the same last ticks. Its answers are the first
one's.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import LiveServer, market, signal_of, start, tick

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = {"CEREBELLAR_NORSE_PERFORMANCE__DEVICE": "cuda"}
TICKS = 40


def serve(srv: LiveServer, markets: list[str], ks: range) -> dict[str, dict[str, Any]]:
    """Post the ``ks``-th ticks of each market one at a time; the answers to the last round."""
    last = {}
    for k in ks:
        for j, m in enumerate(markets):
            r = httpx.post(f"{srv.url}/neural/process", json=tick(m, k, price=100.0 + 3 * j), timeout=30)
            assert r.status_code == 200, r.text
            last[m] = signal_of(r.json())
    return last


def recovered(log: str) -> dict[str, Any]:
    """The fields of the start's "market state recovered" line."""
    lines = [json.loads(line) for line in log.splitlines() if '"market state recovered"' in line]
    assert lines, log[-3000:]
    return dict(lines[-1]["fields"])


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "kill -9"])
def test_market_states_on_the_gpu_survive_a_restart(tmp_path: Path, how: signal.Signals) -> None:
    markets = [market("G") for _ in range(5)]
    ref = start(tmp_path / "ref", tmp_path / "ref.log", CUDA)
    try:
        serve(ref, markets, range(TICKS))
        want = serve(ref, markets, range(TICKS, TICKS + 1))
    finally:
        ref.stop()
    first = start(tmp_path / "state", tmp_path / "first.log", CUDA)
    serve(first, markets, range(TICKS))
    first.proc.send_signal(how)
    assert first.proc.wait(60) == (0 if how == signal.SIGTERM else -signal.SIGKILL), first.log()[-3000:]
    again = start(tmp_path / "state", tmp_path / "again.log", CUDA)
    try:
        got = serve(again, markets, range(TICKS, TICKS + 1))
        fields = recovered(again.log())
    finally:
        again.stop()
    assert fields["markets"] == len(markets)
    if how == signal.SIGKILL:  # every tick from the journal, none from a checkpoint (the first is 60 s away)
        assert fields["replayed_ticks"] == TICKS * len(markets) and fields["from_checkpoint"] == 0, fields
    else:
        assert fields["from_checkpoint"] == len(markets) and fields["replayed_ticks"] == 0, fields
    for m in markets:
        assert got[m]["spike_count"] == want[m]["spike_count"], m
        assert got[m]["probabilities"] == pytest.approx(want[m]["probabilities"], abs=1e-6), m
