"""Helpers of the engine tests: the ground truth (a sequential network), result comparison, tick streams, the CLI."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cerebellar_norse.cli import main
from cerebellar_norse.config import Config
from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.journal import Durability
from cerebellar_norse.engine.records import TickResult
from cerebellar_norse.neurons.network import CerebellarNetwork
from cerebellar_norse.ticks import Tick

ConfigFactory = Callable[..., Config]
StreamFactory = Callable[..., dict[str, list[Tick]]]

T0 = 1_640_995_200_000  # 2022-01-01T00:00:00Z in ms

# What a result says about the network (processing_time_ns and model_version vary by path).
CORE_KEYS = ("market_id", "prediction", "probabilities", "confidence", "spike_count")


def core(result: Mapping[str, Any] | TickResult) -> dict[str, Any]:
    """The network's part of a result (the engine's TickResult or the Python API's dict)."""
    d = result.as_dict() if isinstance(result, TickResult) else result
    return {k: d[k] for k in CORE_KEYS}


def tick(market: str, ts: int, price: float = 100.0, volume: float = 1000.0) -> Tick:
    """A validated tick."""
    return Tick(price, volume, ts, market)


def sequential(cfg: Config, ticks: Sequence[Tick], max_markets: int | None = None) -> tuple[CerebellarNetwork, list[dict[str, Any]]]:
    """Ground truth: a fresh synchronous network fed the ticks one at a time, in order."""
    net = CerebellarNetwork(cfg, max_markets=max_markets)
    return net, [core(net.process_ticks([t])[0]) for t in ticks]


def sequential_markets(cfg: Config, by_market: Mapping[str, Sequence[Tick]]) -> tuple[CerebellarNetwork, dict[str, list[dict[str, Any]]]]:
    """Ground truth per market: one network fed each market's ticks one at a time (markets are independent)."""
    net = CerebellarNetwork(cfg, max_markets=max(len(by_market), 1))
    return net, {m: [core(net.process_ticks([t])[0]) for t in ticks] for m, ticks in by_market.items()}


def assert_same_state(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> None:
    """Two slot states (``StateArrays.read_slot``) are bit for bit equal."""
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def moving_ticks(markets: Sequence[str], per_market: int, start: int = 0, t0: int = T0) -> list[Tick]:
    """Interleaved ticks of ``markets`` with moving prices and volumes (times rising), the k-th round from ``start``."""
    out = []
    for k in range(start, start + per_market):
        for j, m in enumerate(markets):
            price = 100.0 + 3 * j + 0.4 * ((k * 7 + j) % 11) - 0.02 * k
            out.append(Tick(price, 50.0 + (k * 13 + j) % 40, t0 + 250 * k + j, m))
    return out


async def serve(engine: Engine, ticks: Sequence[Tick], batch: int = 5) -> None:
    """Ticks through the engine's submit paths: some batched, some one at a time."""
    for k in range(0, len(ticks), batch):
        part = ticks[k:k + batch]
        if (k // batch) % 2:
            await engine.submit_many(part)
        else:
            for t in part:
                await engine.submit(t)


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """The real command line, in process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def crash(d: Durability) -> None:
    """Abandon the engine as kill -9 would: no checkpoint, no cleanup of the journal (the lock goes with the process)."""
    if d._mm is not None:
        d._mm.close()  # the written pages stay in the page cache, as after a process death
        d._mm = None
    d.closed = True
    d._unlock()
