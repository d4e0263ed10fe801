"""``cerebellar-norse rollout VERSION --replicas URL,…``: one model version on every replica, switched together.

Two phases:

1. *stage*: the model archive (:mod:`cerebellar_norse.training.archive`) is uploaded to
   every replica (``PUT /models/{version}``), which verifies and stores it without
   activating it. If any replica refuses it or cannot be reached, nothing is
   activated anywhere (staged copies stay stored, inactive) and the command exits 1.
2. *activate*: ``POST /models/{version}/activate`` on every replica, one right after
   the other. If one fails, the replicas already switched are switched back to the
   model they served before, and the command exits 1.

Finally every replica's ``/health`` must report the version. Each market lives on
one replica, so each market switches model exactly once, between two of its ticks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx

from ..config import Config
from ..errors import CerebellarNorseError, InputError
from ..httpcalls import client, request
from ..training.archive import MEDIA_TYPE, pack_model
from ..training.checkpoints import ModelStore, check_version
from . import ROLLOUT_TIMEOUT_S


class RolloutError(CerebellarNorseError):
    """A replica refused the model or could not be reached; no replica serves a mix (the message says what happened)."""


def _call(http: httpx.Client, method: str, url: str, **kw: Any) -> dict[str, Any]:
    """The JSON object a replica answers (``{}`` for another body); RolloutError for no answer or an HTTP error."""
    r = request(http, method, url, RolloutError, **kw)
    try:
        body: dict[str, Any] = r.json()
    except ValueError:
        body = {}
    return body if isinstance(body, dict) else {}  # another server's JSON (a list, a number): no answer of a replica


def _field(body: dict[str, Any], key: str, method: str, url: str) -> Any:
    """``body[key]``, or RolloutError saying that the answer is not a replica's (another server's 200)."""
    if key not in body:
        raise RolloutError(f"{method} {url}: the answer has no {key!r} (is {url.rsplit('/', 1)[0]} a cerebellar-norse "
                           "replica?)")
    return body[key]


def rollout(version: str, archive: bytes, replicas: list[str], token: str | None, log: Any = None,
            timeout_s: float = ROLLOUT_TIMEOUT_S) -> dict[str, Any]:
    """Stage ``archive`` as ``version`` on every replica, then activate it on all; returns a report.

    ``timeout_s``: seconds each call waits for a replica (to connect, to send, for each part of the answer).
    """
    say = log or (lambda msg: None)
    with client(token, timeout_s) as http:
        for url in replicas:
            _call(http, "PUT", f"{url}/models/{version}", content=archive, headers={"Content-Type": MEDIA_TYPE})
            say(f"staged {version} on {url}")
        previous = {url: _field(_call(http, "GET", f"{url}/models"), "active", "GET", f"{url}/models") for url in replicas}
        switched: list[str] = []
        try:
            for url in replicas:
                _call(http, "POST", f"{url}/models/{version}/activate")
                switched.append(url)
        except RolloutError as exc:
            say(f"activation failed ({exc}); switching {len(switched)} replica(s) back")
            for url in switched:
                _call(http, "POST", f"{url}/models/{previous[url]}/activate")
            raise
        served = {url: _call(http, "GET", f"{url}/health").get("model_version") for url in replicas}
    wrong = {u: v for u, v in served.items() if v != version}
    if wrong:
        raise RolloutError(f"replicas report another model after activation: {wrong}")
    say(f"{len(replicas)} replica(s) serve {version}")
    return {"version": version, "replicas": replicas, "previous": previous, "bytes": len(archive)}


def cmd_rollout(cfg: Config, version: str, replicas_text: str, token: str | None, model_dir: str | None,
                as_json: bool, timeout_s: float = ROLLOUT_TIMEOUT_S) -> int:
    """The ``rollout`` command: the model comes from ``model_dir`` or this config's model store."""
    check_version(version)
    replicas = [u.strip().rstrip("/") for u in replicas_text.split(",") if u.strip()]
    if not replicas:
        raise InputError("--replicas names no replica", "replicas")
    replicas = [u if "://" in u else f"http://{u}" for u in replicas]
    path = Path(model_dir) if model_dir else ModelStore(Path(cfg.paths.state_dir)).root / version
    archive = pack_model(path)
    report = rollout(version, archive, replicas, token, None if as_json else lambda m: print(m, file=sys.stderr), timeout_s)
    if as_json:
        print(json.dumps(report, indent=2))
    return 0
