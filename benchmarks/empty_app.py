#!/usr/bin/env python3
"""An empty endpoint on the service's server stack, the baseline of ``benchmarks/http_bench.py``.

One FastAPI app with one ``POST /empty`` taking the service's own tick model
(:class:`cerebellar_norse.api.schemas.TickIn`: strict, validated the same way) and
returning a small dict, served by uvicorn with exactly the service's settings
(:func:`cerebellar_norse.api.server.uvicorn_config`: uvloop, httptools, no access log).
What ``/neural/process`` costs beyond this is the service's own work: request ids,
metrics, the engine, the network and the response model.

    .venv/bin/python benchmarks/empty_app.py --port 8090
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI

from cerebellar_norse.api.schemas import TickIn
from cerebellar_norse.api.server import uvicorn_config
from cerebellar_norse.config import load_checked_config

app = FastAPI(title="empty endpoint")


@app.post("/empty")
async def empty(tick: TickIn) -> dict[str, Any]:
    """Validate the tick, do nothing, answer."""
    return {"ok": True, "market_id": tick.market_id}


class _Server(uvicorn.Server):
    """Exit 0 after a graceful SIGTERM (uvicorn re-raises the signal otherwise), like the service."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    cfg = load_checked_config(None, environ={"CEREBELLAR_NORSE_SERVER__PORT": str(args.port)})  # host 127.0.0.1
    _Server(uvicorn_config(app, cfg)).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
