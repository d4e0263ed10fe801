"""``GET /neural/metrics`` and the debug routes answer what their documented schemas say, field by field.

A generated client parses an answer by its schema: a free-form object gives it a bare
dict. Each answer here is walked against the 200 schema of ``/openapi.json``: every
object is typed (its keys exactly the documented properties, all present), except the
two documented as free-form maps (the configuration, the live evaluation), and every
value has its documented type (an ``integer`` an int, a ``number`` a float, as sent).
"""

from __future__ import annotations

from typing import Any

import httpx
from live_helpers import market, tick

FREE_FORM = {"config", "live_evaluation"}  # documented as maps of any JSON: the config sections, the scorer's figures


def resolve(schema: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def mismatches(value: Any, schema: dict[str, Any], doc: dict[str, Any], path: str) -> list[str]:
    """Where ``value`` differs from ``schema`` (an untyped object is a difference unless its key is FREE_FORM)."""
    schema = resolve(schema, doc)
    if "anyOf" in schema:
        tried = [mismatches(value, s, doc, path) for s in schema["anyOf"]]
        return [] if any(not t for t in tried) else min(tried, key=len)
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} not in {schema['enum']}"]
    kind = schema.get("type")
    exact = {"string": str, "boolean": bool, "null": type(None), "array": list, "object": dict}
    if kind == "integer":
        return [] if type(value) is int else [f"{path}: {value!r} is not an integer"]
    if kind == "number":
        return [] if type(value) is float else [f"{path}: {value!r} is not a float"]
    if kind in exact:
        if type(value) is not exact[kind]:
            return [f"{path}: {value!r} is not {kind}"]
    else:
        return [f"{path}: no type documented"]
    if kind == "array":
        return [m for k, v in enumerate(value) for m in mismatches(v, schema.get("items", {}), doc, f"{path}[{k}]")]
    if kind != "object":
        return []
    props = schema.get("properties")
    if props is None:
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return [m for k, v in value.items() for m in mismatches(v, extra, doc, f"{path}.{k}")]
        return [] if path.rsplit(".", 1)[-1] in FREE_FORM else [f"{path}: untyped object"]
    out = [f"{path}: keys {sorted(value)} are not the documented {sorted(props)}"] if set(value) != set(props) else []
    out += [f"{path}: {k} not required" for k in props if k not in schema.get("required", [])]
    return out + [m for k, v in value.items() if k in props for m in mismatches(v, props[k], doc, f"{path}.{k}")]


def test_neural_metrics_and_debug_answers_match_their_documented_schemas(client: httpx.Client) -> None:
    doc = client.get("/openapi.json").json()
    m = market("TYPED")
    for k in range(3):
        assert client.post("/neural/process", json=tick(m, k)).status_code == 200
    assert client.get(f"/debug/markets/{m}/state").status_code == 200  # spike counts kept from here on
    assert client.post("/neural/process/batch", json={"ticks": [tick(m, 3), tick(m, 4)]}).status_code == 200
    rid = client.get("/debug/requests").json()["requests"][0]["request_id"]

    routes = {"/neural/metrics": "/neural/metrics", "/debug/markets": "/debug/markets",
              f"/debug/markets/{m}/state": "/debug/markets/{market_id}/state", "/debug/requests?slow=true": "/debug/requests",
              f"/debug/requests/{rid}": "/debug/requests/{request_id}", "/debug/backtrace": "/debug/backtrace",
              "/debug/config": "/debug/config"}
    for url, documented in routes.items():
        r = client.get(url)
        assert r.status_code == 200, (url, r.text)
        ok = doc["paths"][documented]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert "$ref" in ok, (documented, ok)  # a named model: generated clients get a class
        assert mismatches(r.json(), ok, doc, documented) == []
    state = client.get(f"/debug/markets/{m}/state").json()
    assert state["spike_counts"]["total"] is not None and state["last_tick"] is not None  # the nullable parts, filled
