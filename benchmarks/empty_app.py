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
from typing import Any

from fastapi import FastAPI

from cerebellar_norse.api.schemas import TickIn
from cerebellar_norse.api.server import GracefulServer, uvicorn_config
from cerebellar_norse.config import load_checked_config

app = FastAPI(title="empty endpoint")


@app.post("/empty")
async def empty(tick: TickIn) -> dict[str, Any]:
    """Validate the tick, do nothing, answer."""
    return {"ok": True, "market_id": tick.market_id}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    cfg = load_checked_config(None, environ={"CEREBELLAR_NORSE_SERVER__PORT": str(args.port)})  # host 127.0.0.1
    GracefulServer(uvicorn_config(app, cfg)).run()  # exits 0 after SIGTERM, like the service
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
