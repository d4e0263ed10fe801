"""Launch splitting against the fused kernel for odd shapes."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.mark.parametrize(("precision", "streams", "launch", "markets", "max_batch", "asynchronous"), [
    ("float32", 1, 1, 6, 12, False),
    ("float64", 1, 1, 6, 12, False),
    ("float32", 2, 2, 13, 12, True),
    ("float64", 3, 5, 13, 12, True),
    ("float32", 1, 7, 20, 17, False),
    ("float64", 2, 11, 3, 12, False),
])
def test_odd_launch_sizes_match_fused(backend_pair: Callable[..., Any], tight_cfg: Callable[..., Any], precision: str,
                                      streams: int, launch: int, markets: int, max_batch: int, asynchronous: bool) -> None:
    cfg, plan = tight_cfg(precision, streams, launch, markets=markets, max_batch=max_batch)
    rep, backend = backend_pair(cfg, device="cpu", streams=streams, n_ticks=150, markets=markets, max_batch=max_batch,
                                asynchronous=asynchronous)
    rep.check()
    assert backend.launch_ticks == plan.launch_ticks == launch
    assert backend.memory_used_bytes <= int(cfg.performance.memory_limit)
    backend.close()


def test_uploading_new_markets_stays_within_the_charged_workspace(tight_cfg: Callable[..., Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of markets the device has not seen uploads their state in pieces the workspace covers, not all at once."""
    import numpy as np
    import torch

    from cerebellar_norse.cuda.backend import CudaBackend
    from cerebellar_norse.neurons.parameters import encoder_parameters, network_parameters
    from cerebellar_norse.neurons.state import StateArrays
    from cerebellar_norse.neurons.topology import generate_weights

    markets = batch = 12
    cfg, plan = tight_cfg("float32", 1, 1, markets=markets - 1, max_batch=batch)
    p, w = network_parameters(cfg), generate_weights(cfg)
    st = StateArrays.allocate(markets, p, "float32")
    for s in range(markets):
        st.reset_slot(s, p, float(w.golgi_init))
    be = CudaBackend(w, p, st, encoder_parameters(cfg.neural), batch, device="cpu", use_graphs=False,
                     memory_limit=int(cfg.performance.memory_limit), pool_size=int(cfg.performance.memory_pool_size),
                     pool_enabled=cfg.performance.memory_pool_enabled)
    moved: list[int] = []
    real = torch.Tensor.to

    def spy(self: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        moved.append(self.numel() * self.element_size())
        return real(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    be.step(np.arange(batch, dtype=np.int64), np.array([[100.0] * batch, [1.0] * batch, [1.7e12] * batch]))
    monkeypatch.undo()
    assert be.launch_ticks == 1 and be.memory_used_bytes == int(cfg.performance.memory_limit)
    assert max(moved) <= plan.workspace, (max(moved), plan.workspace)
    be.close()
