"""Staging a model archive (``PUT /models/{version}``): verified, stored atomically, not activated; bad ones change nothing."""

from __future__ import annotations

import errno
import io
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from live_helpers import NO_BOOTSTRAP

from cerebellar_norse.api.deps import ServiceState
from cerebellar_norse.api.server import build_service, make_app
from cerebellar_norse.config import load_checked_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.storage import seal
from cerebellar_norse.training import archive as archive_module
from cerebellar_norse.training.archive import MEDIA_TYPE, pack_model, stage_archive
from cerebellar_norse.training.checkpoints import FILES, MANIFEST, ModelStore

TOKEN = "models-token-77a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BLOB = {**AUTH, "Content-Type": MEDIA_TYPE}


def _service(root: Path, **env: str) -> ServiceState:
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(root), "CEREBELLAR_NORSE_SERVER__API_TOKEN": TOKEN,
               **NO_BOOTSTRAP, **env}
    return build_service(load_checked_config(None, environ=environ))


@pytest.fixture
def tc(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(make_app(_service(tmp_path / "replica"), restore=False, save_on_shutdown=False)) as c:
        yield c


def model(tmp_path: Path, **env: str) -> tuple[str, bytes]:
    cfg = load_checked_config(None, environ={"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "src"), **env})
    w = generate_weights(cfg)
    w.head_bias[:] = np.asarray(w.head_bias) + 0.02
    store = ModelStore(tmp_path / "src")
    version = store.save(w, cfg, {"validation": {"loss": 0.5}})
    return version, pack_model(store.root / version)


def test_staged_model_is_stored_verified_and_not_active(tc: TestClient, tmp_path: Path) -> None:
    version, archive = model(tmp_path)
    r = tc.put(f"/models/{version}", content=archive, headers=BLOB)
    assert r.status_code == 200, r.text
    assert r.json()["stored"] is True and r.json()["active"] == "seed-42"
    again = tc.put(f"/models/{version}", content=archive, headers=BLOB)
    assert again.status_code == 200 and again.json()["stored"] is False  # idempotent
    assert tc.post(f"/models/{version}/activate", headers=AUTH).json()["active"] == version


def test_bad_archives_change_nothing(tc: TestClient, tmp_path: Path) -> None:
    version, archive = model(tmp_path)
    other, other_archive = model(tmp_path / "o", CEREBELLAR_NORSE_NEURAL__GRANULE_SIZE="256")
    corrupt = bytearray(archive)
    corrupt[-5] ^= 0xFF
    cases = [
        (tc.put(f"/models/{version}", content=bytes(corrupt), headers=BLOB), 422, "checksum"),
        (tc.put(f"/models/{version}", content=seal(b"junk"), headers=BLOB), 422, "not a model archive"),
        (tc.put("/models/another-version", content=archive, headers=BLOB), 422, "holds model"),
        (tc.put("/models/.hidden", content=archive, headers=BLOB), 422, "invalid model version"),
        (tc.put(f"/models/{other}", content=other_archive, headers=BLOB), 422, "does not fit"),
        (tc.put(f"/models/{version}", content=archive, headers={**AUTH, "Content-Type": "application/json"}), 415, "octet"),
        (tc.put(f"/models/{version}", content=archive, headers={"Content-Type": MEDIA_TYPE}), 401, "token"),
    ]
    for r, status, words in cases:
        assert r.status_code == status, r.text
        assert words in r.json()["error"]["message"], r.text
    assert tc.get("/models", headers=AUTH).json()["models"] == []  # nothing stored, no temporary directory left
    assert not list((tmp_path / "replica" / "models").glob(".tmp-*"))


def _archive(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.frombuffer(v, dtype=np.uint8) for k, v in files.items()})  # type: ignore[arg-type]
    return seal(buf.getvalue())


@pytest.mark.parametrize("manifest", [b"[]", b'"v"', b"null", b'{"version": "m1", "files": 3}', b"[" * 50_000 + b"]" * 50_000])
def test_archive_with_a_manifest_of_the_wrong_shape_is_422_naming_it(tc: TestClient, manifest: bytes) -> None:
    """The archive's checksum holds (anyone can seal bytes): what is inside is checked like a stored model's files."""
    files = {name: b"x" for name in FILES}
    r = tc.put("/models/m1", content=_archive({**files, MANIFEST: manifest}), headers=BLOB)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"].startswith("request body: manifest.json: "), r.text
    assert tc.get("/models", headers=AUTH).json()["models"] == []


def test_archive_files_are_named_as_in_the_archive(tc: TestClient, tmp_path: Path) -> None:
    """A file whose manifest checksum fails is named by its name in the archive, not by a staging directory."""
    version, _ = model(tmp_path)
    files = {name: (tmp_path / "src" / "models" / version / name).read_bytes() for name in (*FILES, MANIFEST)}
    files["metrics.json"] = b'{"validation": {"loss": 0.4}}'
    r = tc.put(f"/models/{version}", content=_archive(files), headers=BLOB)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"] == "request body: metrics.json: checksum mismatch: the file is corrupt or was changed"
    assert not list((tmp_path / "replica" / "models").glob(".tmp-*"))


def test_concurrent_uploads_of_one_version_store_it_once(tmp_path: Path) -> None:
    """Uploads run on worker threads: eight at once of the same archive store it once, the rest find it stored."""
    version, archive = model(tmp_path)
    svc = _service(tmp_path / "replica")
    store = ModelStore(tmp_path / "replica")
    with ThreadPoolExecutor(8) as pool:
        stored = list(pool.map(lambda _: stage_archive(store, version, archive, svc.cfg), range(8)))
    assert sorted(stored) == [False] * 7 + [True]
    assert store.load(version).version == version
    assert not list(store.root.glob(".tmp-*"))


def test_a_model_named_active_is_refused_and_activation_keeps_working(tc: TestClient, tmp_path: Path) -> None:
    """``ACTIVE`` is the file naming the active model: an archive staged under that name would become a directory
    ``models/ACTIVE`` (listed nowhere) and every later activation would fail writing the file (503)."""
    version, _ = model(tmp_path)
    src = tmp_path / "src" / "models" / version
    files = {name: (src / name).read_bytes() for name in (*FILES, MANIFEST)}
    files[MANIFEST] = files[MANIFEST].replace(f'"{version}"'.encode(), b'"ACTIVE"')
    r = tc.put("/models/ACTIVE", content=_archive(files), headers=BLOB)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "version" and "reserved" in r.json()["error"]["message"], r.text
    assert not (tmp_path / "replica" / "models" / "ACTIVE").exists()
    assert tc.put(f"/models/{version}", content=pack_model(src), headers=BLOB).status_code == 200
    assert tc.post(f"/models/{version}/activate", headers=AUTH).json()["active"] == version


@pytest.mark.parametrize("path", ["/models/a%2Fb", "/models/a%2F..%2Fb"])
def test_a_version_with_a_slash_is_a_documented_404(tc: TestClient, tmp_path: Path, path: str) -> None:
    """A version holding a "/" names no route (404 not_found); the operation documents that status, and the
    version's rule (pattern, length) is in the document."""
    _, archive = model(tmp_path)
    r = tc.put(path, content=archive, headers=BLOB)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found", r.text
    op = tc.get("/openapi.json").json()["paths"]["/models/{version}"]["put"]
    assert "404" in op["responses"]
    schema = op["parameters"][0]["schema"]
    assert schema["maxLength"] == 128 and "/" not in schema["pattern"]
    assert tc.get("/models", headers=AUTH).json()["models"] == []


@pytest.mark.parametrize(("code", "status", "kind"), [(errno.ENOSPC, 503, "capacity"), (errno.EROFS, 503, "capacity"),
                                                      (errno.EIO, 503, "engine")])
def test_a_write_that_fails_stores_nothing_and_says_why(tc: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        code: int, status: int, kind: str) -> None:
    """No room or a read-only state dir is a 503 ``capacity`` with Retry-After (the service itself is fine: upload
    again once there is room); another write failure stays an ``engine`` error. Either way nothing is stored."""
    version, archive = model(tmp_path)
    real = archive_module.atomic_write_bytes
    calls = {"n": 0}

    def failing(path: Path, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the second file of the archive
            raise OSError(code, os.strerror(code), str(path))
        real(path, data)

    monkeypatch.setattr(archive_module, "atomic_write_bytes", failing)
    r = tc.put(f"/models/{version}", content=archive, headers=BLOB)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == kind and "cannot store the model: writing failed at" in err["message"]
    assert os.strerror(code) in err["message"]
    if kind == "capacity":
        assert int(r.headers["Retry-After"]) == 60 and "nothing was stored" in err["message"]
    assert tc.get("/models", headers=AUTH).json()["models"] == []
    assert not list((tmp_path / "replica" / "models").glob(".tmp-*"))
    assert tc.get("/health").status_code == 200
    monkeypatch.setattr(archive_module, "atomic_write_bytes", real)
    again = tc.put(f"/models/{version}", content=archive, headers=BLOB)
    assert again.status_code == 200 and again.json()["stored"] is True


@pytest.mark.parametrize(("code", "kind"), [(errno.ENOSPC, "capacity"), (errno.EDQUOT, "capacity"), (errno.EIO, "engine")])
def test_an_activation_whose_active_file_cannot_be_written_changes_nothing_and_says_why(
        tc: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, kind: str) -> None:
    """models/ACTIVE on a full disk: 503 ``capacity`` with Retry-After, as an upload's (it was an ``engine`` error,
    logged as one, for a service that is fine); another write failure stays ``engine``. The served model and
    models/ACTIVE are unchanged, and the activation succeeds once the file can be written."""
    version, archive = model(tmp_path)
    assert tc.put(f"/models/{version}", content=archive, headers=BLOB).status_code == 200
    real = ModelStore.set_active

    def failing(self: ModelStore, v: str) -> None:
        raise OSError(code, os.strerror(code), str(self.root / "ACTIVE"))

    monkeypatch.setattr(ModelStore, "set_active", failing)
    r = tc.post(f"/models/{version}/activate", headers=AUTH)
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["type"] == kind and f"cannot write {tmp_path / 'replica' / 'models' / 'ACTIVE'}: {os.strerror(code)}" \
        in err["message"]
    if kind == "capacity":
        assert int(r.headers["Retry-After"]) == 60 and "nothing was changed" in err["message"]
    assert tc.get("/health").json()["model_version"] == "seed-42"
    assert not (tmp_path / "replica" / "models" / "ACTIVE").exists()
    monkeypatch.setattr(ModelStore, "set_active", real)
    assert tc.post(f"/models/{version}/activate", headers=AUTH).json()["active"] == version


@pytest.mark.parametrize(("metrics", "named"), [
    ({"validation": [1]}, "validation is '[1]', expected an object or null"),
    ({"edge": 5}, "edge is '5', expected a string or null"),
    ({"test": {"verdict": "hold"}}, 'test.verdict is \'"hold"\', expected an object or null'),
])
def test_a_model_whose_listed_metrics_have_another_type_is_refused(tc: TestClient, tmp_path: Path,
                                                                    metrics: dict[str, object], named: str) -> None:
    """Such a model was staged (200), and from then on every GET /models answered 500: its metrics are passed on as
    they are, and the answer's schema refused them."""
    cfg = load_checked_config(None, environ={"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "src")})
    store = ModelStore(tmp_path / "src")
    version = store.save(generate_weights(cfg), cfg, metrics)
    buf = io.BytesIO()  # packed as pack_model does (which refuses to pack it now)
    np.savez(buf, **{n: np.frombuffer((store.root / version / n).read_bytes(), dtype=np.uint8) for n in (*FILES, MANIFEST)})
    r = tc.put(f"/models/{version}", content=seal(buf.getvalue()), headers=BLOB)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"] == f"request body: metrics.json: {named}"
    listing = tc.get("/models", headers=AUTH)
    assert listing.status_code == 200 and listing.json()["models"] == []  # nothing stored
    (tmp_path / "replica" / "models").mkdir(exist_ok=True)  # one put there by hand is listed as invalid, never a 500
    shutil.copytree(store.root / version, tmp_path / "replica" / "models" / version)
    (entry,) = tc.get("/models", headers=AUTH).json()["models"]
    assert entry["valid"] is False and entry["error"].endswith(f"metrics.json: {named}")
