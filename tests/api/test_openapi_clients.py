"""What a client generated from ``/openapi.json``, or a validating proxy, reads from the document.

Generators (openapi-python-client, datamodel-code-generator, openapi-typescript) and proxies
that check answers against the document (Stoplight Prism) take every media type, header and
enum of it literally: an answer to HEAD documented with a JSON body is parsed as JSON, a
header the service always sends is invisible unless declared, and enum members need names
of their own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import load_checked_config

TOKEN = "clients-t0ken-5c1e"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IDENTIFIER = re.compile(r"^[A-Z][A-Z0-9_]*$")


@pytest.fixture
def tc(tmp_path: Path) -> Iterator[TestClient]:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), **NO_BOOTSTRAP,
               "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN}
    with TestClient(make_app(build_service(load_checked_config(None, environ=environ)), restore=False,
                             save_on_shutdown=False)) as c:
        yield c


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, item in doc["paths"].items() for method, op in item.items()]


def test_answers_to_head_are_documented_without_content(tc: TestClient) -> None:
    """A generated client parsed the documented JSON of HEAD /health from the empty answer (JSONDecodeError), and Prism
    answered 500 for it."""
    doc = tc.get("/openapi.json").json()
    heads = [(path, op) for method, path, op in operations(doc) if method == "head"]
    assert {path for path, _ in heads} == {"/health", "/metrics"}
    for path, op in heads:
        for status, response in op["responses"].items():
            assert "content" not in response, (path, status)
    r = tc.head("/health")
    assert r.status_code == 200 and r.content == b""
    get = doc["paths"]["/health"]["get"]["responses"]
    assert "application/json" in get["200"]["content"] and "application/json" in get["503"]["content"]


def test_every_documented_answer_declares_the_request_id_header_it_carries(tc: TestClient) -> None:
    doc = tc.get("/openapi.json").json()
    ops = operations(doc)
    assert len(ops) > 25
    pattern = None
    for method, path, op in ops:
        for status, response in op["responses"].items():
            header = response.get("headers", {}).get("X-Request-ID")
            assert header is not None and header["required"] is True, (method, path, status)
            pattern = header["schema"]["pattern"]
    assert doc["paths"]["/neural/moves"]["get"]["responses"]["401"]["headers"]["WWW-Authenticate"]
    assert doc["paths"]["/neural/process"]["post"]["responses"]["503"]["headers"]["Retry-After"]
    assert pattern is not None
    tick = {"price": 1.0, "volume": 1.0, "timestamp": 1640995200000, "market_id": "RID"}
    answers = [tc.get("/health"), tc.head("/metrics"), tc.get("/neural/moves"), tc.get("/neural/moves", headers=AUTH),
               tc.get("/debug/markets?limit=0", headers=AUTH), tc.delete("/neural/markets/NOPE", headers=AUTH),
               tc.post("/neural/process", json=tick), tc.post("/neural/process", json={**tick, "price": 0}),
               tc.post("/neural/process", content=b"{", headers={"Content-Type": "application/json"}),
               tc.post("/neural/process", json=tick, headers={"X-Request-ID": "ord-7f3a"}),
               tc.post("/neural/process", json=tick, headers={"X-Request-ID": "not ok"})]
    assert {r.status_code for r in answers} == {200, 400, 401, 404, 422}
    for r in answers:
        assert re.fullmatch(pattern, r.headers.get("x-request-id", "")), (r.request.url, r.status_code, r.headers)
    assert answers[-2].headers["x-request-id"] == "ord-7f3a"


def test_zones_of_the_training_request_have_enum_member_names_of_their_own(tc: TestClient) -> None:
    """openapi-python-client stopped on the document: "Duplicate key GMT0 in enum" (GMT+0, GMT-0 and GMT0)."""
    schema = tc.get("/openapi.json").json()["components"]["schemas"]["TrainingRequest"]["properties"]["data_timezone"]
    enum = next(s for s in schema["anyOf"] if "enum" in s)
    names = enum["x-enum-varnames"]
    assert len(names) == len(enum["enum"]) > 300
    assert len(set(names)) == len(names)
    assert all(IDENTIFIER.match(n) for n in names), [n for n in names if not IDENTIFIER.match(n)][:5]
    named = dict(zip(enum["enum"], names, strict=True))
    assert named["Etc/GMT+0"] == "ETC_GMT_PLUS_0" and named["Etc/GMT-0"] == "ETC_GMT_MINUS_0"
    assert named["Etc/GMT0"] == "ETC_GMT0" and named["America/New_York"] == "AMERICA_NEW_YORK"
    # each generator's own spelling of a member (upper case, punctuation dropped or "_") is unique as well
    for squash in (lambda n: n.replace("_", ""), lambda n: re.sub(r"_+", "_", n)):
        assert len({squash(n) for n in names}) == len(names)
