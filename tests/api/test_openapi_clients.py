"""What a client generated from ``/openapi.json``, or a validating proxy, reads from the document.

Generators (openapi-python-client, datamodel-code-generator, openapi-typescript) and proxies
that check answers against the document (Stoplight Prism) take every media type, header and
enum of it literally: an answer to HEAD documented with a JSON body is parsed as JSON, a
header the service always sends is invisible unless declared, and enum members need names
of their own.
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, get_args

import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.routes.training import TrainingStatusOut
from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.cli import main
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.training.jobs import JobStateName, JobStatus

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
    assert {path for path, _ in heads} == {path for method, path, _ in operations(doc) if method == "get"}  # every GET's
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
    unauthorized = [op["responses"]["401"] for _, _, op in ops if "401" in op["responses"]]
    assert len(unauthorized) > 15
    for response in unauthorized:  # always sent with the 401
        assert response["headers"]["WWW-Authenticate"]["required"] is True
        assert response["headers"]["WWW-Authenticate"]["schema"]["const"] == "Bearer"
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
    assert answers[2].status_code == 401 and answers[2].headers["www-authenticate"] == "Bearer"


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


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records the path of every request; answers each 404 (the commands then report the part as failed)."""

    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.paths.append(self.path)
        body = b'{"error": {"type": "not_found", "message": "stub", "field": null, "request_id": "r"}}'
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def query_problems(doc: dict[str, Any], sent: str) -> list[str]:
    """What of ``sent``'s query the document's parameters refuse (a boolean is true or false, an integer in range)."""
    path, _, query = sent.partition("?")
    op = doc["paths"][path]["get"]
    params = {p["name"]: p["schema"] for p in op.get("parameters", []) if p["in"] == "query"}
    problems = []
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        schema = params.get(name)
        if schema is None:
            problems.append(f"{sent}: {name} is no parameter")
        elif schema["type"] == "boolean" and value not in ("true", "false"):
            problems.append(f"{sent}: {name}={value} is no boolean (true or false)")
        elif schema["type"] == "integer" and not (value.isdigit() and schema.get("minimum", 0) <= int(value)
                                                  <= schema.get("maximum", int(value))):
            problems.append(f"{sent}: {name}={value} is out of the document's range")
    return problems


def test_the_commands_ask_the_service_with_queries_its_document_allows(tc: TestClient, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`trace --slow` and `debug-bundle` asked ``/debug/requests?slow=1``: the document's ``slow`` is a boolean
    (true or false), and a proxy validating requests against it (Prism) refused them."""
    doc = tc.get("/openapi.json").json()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), **NO_BOOTSTRAP}
    _Recorder.paths = []
    try:
        with pytest.MonkeyPatch.context() as mp:
            for k, v in environ.items():
                mp.setenv(k, v)
            assert main(["trace", "--slow", "5", "--url", url]) == 1
            assert main(["debug-bundle", "--url", url, "--output", str(tmp_path / "b.tar.gz")]) == 1
    finally:
        srv.shutdown()
        srv.server_close()
    capsys.readouterr()
    asked = [p for p in _Recorder.paths if "?" in p]
    assert sum(p.startswith("/debug/requests?") for p in asked) == 2, _Recorder.paths
    assert [problem for p in asked for problem in query_problems(doc, p)] == []
    assert tc.get("/debug/requests?slow=true&limit=2", headers=AUTH).json()["order"] == "slowest"


def test_every_integer_of_the_document_says_its_size(tc: TestClient) -> None:
    """A typed client's generator reads an integer without a format as 32 bits: a tick's timestamp (ms since the epoch)
    and the pool's bytes overflow it. int32 only where the documented range fits."""
    doc = tc.get("/openapi.json").json()
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "integer":
                found.append((where, node))
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    walk(doc, "")
    assert len(found) > 15
    for where, schema in found:
        assert schema.get("format") in ("int32", "int64"), where
        if schema["format"] == "int32":
            assert schema["minimum"] >= -(2**31) and schema["maximum"] <= 2**31 - 1, where
    schemas = doc["components"]["schemas"]
    assert schemas["TickIn"]["properties"]["timestamp"]["format"] == "int64"
    assert schemas["PoolOut"]["properties"]["bytes"]["format"] == "int64"
    assert schemas["ImportOut"]["properties"]["last_timestamp"]["format"] == "int64"
    limit = next(p for p in doc["paths"]["/debug/markets"]["get"]["parameters"] if p["name"] == "limit")
    assert limit["schema"]["format"] == "int32"


def test_every_operation_has_an_operation_id_of_its_own_words(tc: TestClient) -> None:
    """Generators name a client's functions after the operationId: FastAPI's made-up ones
    (``health_health_get``, ``activate_models__version__activate_post``) gave a Python client
    ``health_health_get.sync(...)``; each is a plain name now, its HEAD twin the same with ``_head``."""
    ops = operations(tc.get("/openapi.json").json())
    ids = [op["operationId"] for _, _, op in ops]
    assert len(ids) == len(set(ids)) > 25
    for method, path, op in ops:
        oid = op["operationId"]
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", oid), (method, path, oid)
        assert not oid.endswith(("_get", "_post", "_put", "_delete")) and "models_models" not in oid, (method, path, oid)
        if method == "head":
            get = tc.get("/openapi.json").json()["paths"][path]["get"]["operationId"]
            assert oid == f"{get}_head", (path, oid)
    named = {(method, path): op["operationId"] for method, path, op in ops}
    assert named["get", "/health"] == "health" and named["post", "/neural/process"] == "process_tick"
    assert named["post", "/models/{version}/activate"] == "activate_model" and named["get", "/models"] == "list_models"


@pytest.mark.parametrize("token", [True, False])
def test_the_document_passes_the_linters_rules_it_once_broke(tmp_path: Path, token: bool) -> None:
    """spectral (oas) and redocly (recommended) reported 37 operations with no security (the open ones: redocly cannot
    tell open from forgotten), tags used but not declared, no servers, no licence, and a PNG answer without a schema
    (openapi-typescript typed it ``unknown``)."""
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), **NO_BOOTSTRAP}
    if token:
        environ["CEREBELLAR_NORSE_SERVER__API_TOKEN"] = TOKEN
    with TestClient(make_app(build_service(load_checked_config(None, environ=environ)), restore=False,
                             save_on_shutdown=False)) as c:
        doc = c.get("/openapi.json").json()
    declared = {t["name"] for t in doc["tags"]}
    assert all(t.get("description") for t in doc["tags"])
    ops = operations(doc)
    for method, path, op in ops:
        assert op["tags"] and set(op["tags"]) <= declared, (method, path)
        assert "security" in op, (method, path)
        assert op["security"] == ([{"bearerAuth": []}] if token and "401" in op["responses"] else []), (method, path)
    assert {path for _, path, op in ops if op["security"] == []} >= {"/health", "/metrics", "/neural/process"}
    assert doc["servers"] == [{"url": "/", "description": "The service that serves this document."}]
    assert doc["info"]["license"]["identifier"] == "LicenseRef-Proprietary"
    png = doc["paths"]["/debug/markets/{market_id}/raster.png"]["get"]["responses"]["200"]["content"]["image/png"]
    assert png["schema"] == {"type": "string", "format": "binary"}


def test_spectral_finds_nothing(tc: TestClient, tmp_path: Path) -> None:
    """``spectral lint`` with tests/api/spectral.yaml (spectral:oas; info-contact off, docs/http.md says why), where
    spectral is installed (npm @stoplight/spectral-cli; or CEREBELLAR_NORSE_SPECTRAL=/path/to/spectral)."""
    spectral = os.environ.get("CEREBELLAR_NORSE_SPECTRAL") or shutil.which("spectral")
    if not spectral:
        pytest.skip("spectral is not installed (npm install @stoplight/spectral-cli)")
    doc = tmp_path / "openapi.json"
    doc.write_text(tc.get("/openapi.json").text)
    ruleset = Path(__file__).with_name("spectral.yaml")
    r = subprocess.run([spectral, "lint", str(doc), "--ruleset", str(ruleset), "--fail-severity", "hint"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_answers_a_quant_reads_are_typed_in_the_document(tc: TestClient) -> None:
    """``GET /models``, the activation and a training job's status were documented as any object: a generated client
    handed them back as a bag of additional properties (openapi-python-client) or ``Record<string, unknown>``
    (openapi-typescript), with no field, enum or date-time of its own. Each is a named schema now, its fields those the
    service sends (a job's: every field of its record, the nullable ones present as null)."""
    doc = tc.get("/openapi.json").json()
    named = {("get", "/models", "200"): "ModelsOut", ("post", "/models/{version}/activate", "200"): "ActivatedOut",
             ("get", "/training/status/{job_id}", "200"): "TrainingStatusOut",
             ("delete", "/training/{job_id}", "200"): "TrainingStatusOut"}
    for (method, path, status), name in named.items():
        schema = doc["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{name}"}, (method, path)
    job = doc["components"]["schemas"]["TrainingStatusOut"]
    assert set(job["properties"]) == set(JobStatus.__dataclass_fields__) == set(job["required"])
    assert set(job["properties"]["state"]["enum"]) == set(get_args(JobStateName))
    time_of = {"type": "string", "format": "date-time", "examples": ["2026-11-27T03:15:22Z"]}
    assert job["properties"]["created"] == {**time_of, "title": "Created"}
    for k in ("started", "finished"):  # the format on the string: openapi-python-client left one beside anyOf a str
        assert job["properties"][k]["anyOf"] == [time_of, {"type": "null"}], job["properties"][k]
    record = JobStatus(job_id="j1", state="succeeded", files=["a.csv"], started=1.8e9, finished=1.8e9 + 60, epoch=2,
                       epochs=2, loss=float("nan"), loss_history=[0.9, float("inf")], validation={"accuracy": 0.4},
                       model_version="m1", activated=True).as_dict()
    out = TrainingStatusOut.model_validate(record).model_dump()
    assert out == record and out["loss_history"] == [0.9, None] and out["finished"] == "2027-01-15T08:01:00Z"
    models = tc.get("/models", headers=AUTH)
    assert models.status_code == 200 and set(models.json()) == {"active", "models"}


def test_the_request_id_header_is_a_parameter_and_the_market_header_is_not(tc: TestClient) -> None:
    """X-Request-ID was in docs/http.md only: a client generated from the document had no way to send it with a call.
    X-Market-ID stays out: a schema-driven client would generate it apart from the body, naming another market than
    the ticks, and have valid ticks refused 422."""
    doc = tc.get("/openapi.json").json()
    for method, path, op in operations(doc):
        headers = {p["name"]: p for p in op.get("parameters", []) if p["in"] == "header"}
        assert headers["X-Request-ID"]["required"] is False, (method, path)
        assert "X-Market-ID" not in headers, (method, path)
    tick = {"price": 1.0, "volume": 1.0, "timestamp": 1640995200000, "market_id": "HDR"}
    r = tc.post("/neural/process", json=tick, headers={"X-Request-ID": "ord-1", "X-Market-ID": "HDR"})
    assert r.status_code == 200 and r.json()["request_id"] == r.headers["x-request-id"] == "ord-1"
