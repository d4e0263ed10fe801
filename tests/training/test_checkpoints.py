"""Model store: atomic model directories, SHA-256 manifests, the ACTIVE pointer, fallbacks, CLI integrity checks."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from training_helpers import REPO_ROOT, TINY_NEURAL, ConfigFactory, server_environ

from cerebellar_norse import cli
from cerebellar_norse.config import Config
from cerebellar_norse.errors import CheckpointError
from cerebellar_norse.neurons.topology import Weights, generate_weights
from cerebellar_norse.training.checkpoints import (
    FILES,
    MANIFEST,
    MODEL_FORMAT,
    WEIGHT_FIELDS,
    ModelStore,
    StoredModel,
    check_weights,
    load_model_dir,
    parse_manifest,
    verify_tree,
    weights_from_bytes,
)
from cerebellar_norse.training.commands import cmd_validate_model, cmd_verify_data

V1, V2, V3 = "20240101T000000Z-aaaaaa", "20240102T000000Z-bbbbbb", "20240103T000000Z-cccccc"
METRICS = {"validation": {"loss": 0.95, "accuracy": 0.5}, "history": [{"epoch": 1, "train_loss": 1.0}]}


def perturbed(w: Weights, k: float) -> Weights:
    """A copy with different trainable weights (same topology)."""
    out = w.copy()
    out.pf_w = (out.pf_w * (1.0 + k)).astype(out.pf_w.dtype)
    out.w_out = (out.w_out + k).astype(out.w_out.dtype)
    return out


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def assert_same_weights(a: Weights, b: Weights) -> None:
    for name in WEIGHT_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    assert a.golgi_init == b.golgi_init


@pytest.fixture
def store(cfg: Config) -> ModelStore:
    return ModelStore(Path(cfg.paths.state_dir))


# --------------------------------------------------------------------------------------
# Save and load
# --------------------------------------------------------------------------------------


def test_save_load_round_trip(cfg: Config, store: ModelStore) -> None:
    w = perturbed(generate_weights(cfg), 0.1)
    version = store.save(w, cfg, {**METRICS, "numpy": np.float32(0.5)})
    assert store.versions() == [version]
    assert sorted(p.name for p in (store.root / version).iterdir()) == sorted([*FILES, MANIFEST])
    assert not any(p.name.startswith(".") for p in store.root.iterdir())  # no temporary left behind
    m = store.load(version)
    assert m.version == version and m.path == store.root / version
    assert_same_weights(m.weights, w)
    assert m.neural == cfg.neural.model_dump(mode="json")
    assert m.metrics["validation"] == METRICS["validation"] and m.metrics["numpy"] == 0.5
    assert m.score == 0.95
    manifest = json.loads((store.root / version / MANIFEST).read_text())
    assert manifest["version"] == version and set(manifest["files"]) == set(FILES)


def test_each_model_file_is_read_once_so_what_is_checked_is_what_is_loaded(cfg: Config, store: ModelStore,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A file replaced between its checksum and its load must not be loaded unchecked: one read serves both."""
    version = store.save(perturbed(generate_weights(cfg), 0.1), cfg, METRICS)
    opened: list[str] = []
    real_open = io.open

    def counting_open(file: object, *args: object, **kwargs: object) -> object:
        opened.append(Path(str(file)).name)
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr("builtins.open", counting_open)
    load_model_dir(store.root / version)
    monkeypatch.undo()
    assert sorted(n for n in opened if n in FILES) == sorted(FILES), opened


def test_versions_sort_by_time_and_skip_hidden(cfg: Config, store: ModelStore) -> None:
    w = generate_weights(cfg)
    for v in (V2, V1):
        store.save(w, cfg, METRICS, version=v)
    auto = store.save(w, cfg, METRICS)  # UTC time now: newer than both
    assert store.versions() == [V1, V2, auto]
    assert store.active_version() is None
    store.set_active(V1)
    assert store.active_version() == V1


@pytest.mark.parametrize("name", FILES)
def test_manifest_detects_a_flipped_byte_and_names_the_file(cfg: Config, store: ModelStore, name: str) -> None:
    version = store.save(generate_weights(cfg), cfg, METRICS)
    target = store.root / version / name
    flip_byte(target)
    with pytest.raises(CheckpointError, match="checksum mismatch") as exc:
        store.load(version)
    assert exc.value.path == str(target)
    assert str(target) in str(exc.value)


def test_a_missing_file_is_named(cfg: Config, store: ModelStore) -> None:
    version = store.save(generate_weights(cfg), cfg, METRICS)
    (store.root / version / "config.json").unlink()
    with pytest.raises(CheckpointError, match="missing") as exc:
        store.load(version)
    assert exc.value.path == str(store.root / version / "config.json")
    (store.root / version / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="manifest") as exc:
        store.load(version)
    assert exc.value.path == str(store.root / version / MANIFEST)


@pytest.mark.parametrize(("name", "err", "remedy"), [
    ("weights.npz", errno.EIO, "check the disk (journalctl -k)"),
    (MANIFEST, errno.EMFILE, "free file descriptors or memory"),
    ("metrics.json", errno.ENOMEM, "free file descriptors or memory")])
def test_a_model_file_whose_read_fails_for_no_fault_of_its_bytes_is_unreadable_not_corrupt(
        cfg: Config, store: ModelStore, monkeypatch: pytest.MonkeyPatch, unreadable: Callable[[Path, int], None], name: str, err: int, remedy: str) -> None:
    """An I/O error, no descriptor or no memory says nothing about a model file's bytes: it is refused as unreadable
    (the start stops in one line, nothing moved aside), as a permission is, not taken for a corrupt model (which
    served another and moved aside the market states saved with it)."""
    from cerebellar_norse.errors import ModelUnreadableError

    version = store.save(generate_weights(cfg), cfg, METRICS)
    target = store.root / version / name
    unreadable(target, err)
    with pytest.raises(ModelUnreadableError) as caught:
        store.load(version)
    assert caught.value.errno == err and caught.value.path == str(target)
    line = str(caught.value.storage_error())
    assert line.startswith(f"cannot read model file {target}: ") and f"(errno {err} {errno.errorcode[err]})" in line
    assert "nothing is moved aside" in line and remedy in line
    monkeypatch.undo()
    assert store.load(version).version == version  # the file was intact all along


def test_truncated_manifest_is_named(cfg: Config, store: ModelStore) -> None:
    version = store.save(generate_weights(cfg), cfg, METRICS)
    mpath = store.root / version / MANIFEST
    mpath.write_bytes(mpath.read_bytes()[:20])
    with pytest.raises(CheckpointError) as exc:
        load_model_dir(store.root / version)
    assert exc.value.path == str(mpath)


WRONG_MANIFESTS = {
    "a list": b"[]",
    "a string": b'"v1"',
    "null": b"null",
    "files not an object": b'{"files": 3}',
    "an entry not an object": b'{"files": {"weights.npz": 7}}',
    "version not a string": b'{"version": 5, "files": {}}',
    "nested too deeply": b'{"files": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    "not UTF-8": b'{"files": "\xff"}',
}


@pytest.mark.parametrize("text", WRONG_MANIFESTS.values(), ids=WRONG_MANIFESTS.keys())
def test_manifest_of_the_wrong_shape_is_named(cfg: Config, store: ModelStore, text: bytes) -> None:
    """Valid JSON or not, a manifest that is not one is a CheckpointError naming it, at start as on upload."""
    version = store.save(generate_weights(cfg), cfg, METRICS)
    mpath = store.root / version / MANIFEST
    mpath.write_bytes(text)
    with pytest.raises(CheckpointError, match="manifest") as exc:
        load_model_dir(store.root / version)
    assert exc.value.path == str(mpath)
    assert store.load_for_service(cfg) is None  # refused, not a crash: the caller serves the untrained network
    with pytest.raises(CheckpointError, match="manifest") as exc:
        parse_manifest(text, "request body: manifest.json")
    assert exc.value.path == "request body: manifest.json"


def test_a_model_of_a_newer_format_is_refused_as_such_and_one_without_a_format_is_served(
        cfg: Config, store: ModelStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model directory carried no format marker: a model a newer version stored in a changed format (found after a
    rollback, or uploaded to a replica not yet upgraded) would have been served as if it were of this version's. Its
    manifest says its format now; a newer one is refused naming it, at start (another model is served) as on upload
    and by --validate-model; a manifest without one (models stored before the marker) is format 1."""
    w = generate_weights(cfg)
    store.save(w, cfg, METRICS, version=V1)
    store.save(perturbed(w, 0.1), cfg, METRICS, version=V2)
    store.set_active(V2)
    mpath = store.root / V2 / MANIFEST
    manifest = json.loads(mpath.read_text())
    assert manifest["format"] == MODEL_FORMAT == 1
    del manifest["format"]  # as models stored before the marker
    mpath.write_text(json.dumps(manifest))
    assert store.load_for_service(cfg).version == V2  # type: ignore[union-attr]
    mpath.write_text(json.dumps({**manifest, "format": 2}))
    newer = (f"{mpath}: written by a newer version of cerebellar-norse (model format 2; this version reads format 1 "
             "and older)")
    with pytest.raises(CheckpointError) as exc:
        load_model_dir(store.root / V2)
    assert str(exc.value).startswith(newer)
    assert store.load_for_service(cfg).version == V1  # type: ignore[union-attr]
    assert "written by a newer version" in store.refused[V2]
    with pytest.raises(CheckpointError, match="model format 2"):
        parse_manifest(mpath.read_bytes(), "request body: manifest.json")
    assert cmd_validate_model(str(store.root / V2)) == 1
    assert newer in capsys.readouterr().err
    assert json.loads(mpath.read_text())["format"] == 2  # left as it is


@pytest.mark.parametrize("version", ["A" * 5000, "v1\nERROR forged log line", "../v1", ".v1", ""],
                         ids=["5000 characters", "a newline", "a path", "hidden", "empty"])
def test_a_manifest_whose_version_is_no_model_version_is_refused(cfg: Config, store: ModelStore, version: str) -> None:
    """Fuzzed: a manifest's version was served as the model's name as it stood; one of 5000 characters made the
    journal file's header (which names the model) too long, and the start failed with a traceback."""
    stored = store.save(generate_weights(cfg), cfg, METRICS)
    mpath = store.root / stored / MANIFEST
    mpath.write_text(json.dumps({**json.loads(mpath.read_text()), "version": version}))
    with pytest.raises(CheckpointError, match=r"the manifest's version .* is not a model version") as exc:
        load_model_dir(store.root / stored)
    assert exc.value.path == str(mpath) and len(str(exc.value)) < 400
    assert store.load_for_service(cfg) is None  # refused, not a crash: the caller serves the untrained network


@pytest.mark.parametrize("name", ["config.json", "metrics.json"])
@pytest.mark.parametrize("text", [b"[1, 2]", b"[" * 50_000 + b"]" * 50_000], ids=["a list", "nested too deeply"])
def test_model_json_files_must_hold_an_object(cfg: Config, store: ModelStore, name: str, text: bytes) -> None:
    version = store.save(generate_weights(cfg), cfg, METRICS)
    path = store.root / version / name
    path.write_bytes(text)
    manifest = json.loads((store.root / version / MANIFEST).read_text())
    manifest["files"][name] = {"bytes": len(text), "sha256": hashlib.sha256(text).hexdigest()}  # consistent, still wrong
    (store.root / version / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as exc:
        load_model_dir(store.root / version)
    assert exc.value.path == str(path)


@pytest.mark.parametrize("content", [b"\xff\xfe garbage", b"../../etc", b"v1\x00x", b".hidden", b"a/b"],
                         ids=["not UTF-8", "a path out of the store", "NUL", "hidden", "slash"])
def test_an_active_file_that_names_no_version_falls_back_to_the_newest(cfg: Config, store: ModelStore, content: bytes,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    store.save(generate_weights(cfg), cfg, METRICS, version=V1)
    (store.root / "ACTIVE").write_bytes(content)
    with caplog.at_level(logging.ERROR, logger="cerebellar_norse.models"):
        assert store.active_version() is None
        assert store.load_for_service(cfg).version == V1  # type: ignore[union-attr]
    assert any("does not name a model version" in r.getMessage() for r in caplog.records)


def test_weights_not_matching_their_own_config_are_refused(cfg: Config, store: ModelStore, make_config: ConfigFactory) -> None:
    other = make_config(neural={**TINY_NEURAL, "granule_size": 96})
    version = store.save(generate_weights(other), cfg, METRICS)  # manifest fine, shapes not
    with pytest.raises(CheckpointError, match="do not match the stored config") as exc:
        store.load(version)
    assert exc.value.path.endswith("weights.npz")


# --------------------------------------------------------------------------------------
# What the service loads
# --------------------------------------------------------------------------------------


def test_partial_tmp_dir_is_ignored_and_cleaned(cfg: Config, store: ModelStore) -> None:
    w = generate_weights(cfg)
    store.save(w, cfg, METRICS, version=V1)
    # a job killed mid-write: a newer version's temporary directory with part of its files
    tmp = store.root / f".tmp-{V2}-99999999"  # a pid above any pid_max: its writer is gone
    tmp.mkdir()
    (tmp / "weights.npz").write_bytes(b"PK\x03\x04 half written")
    assert store.versions() == [V1]
    ok, problems = verify_tree(store.root.parent)
    assert problems == [] and len(ok) == 1
    model = store.load_for_service(cfg)  # cleans first
    assert model is not None and model.version == V1
    assert_same_weights(model.weights, w)
    assert not tmp.exists()
    tmp.mkdir()
    assert store.clean_partial() == [tmp.name]
    assert not tmp.exists() and store.versions() == [V1]
    assert store.clean_partial() == []


def test_partial_dir_of_a_live_writer_is_kept(cfg: Config, store: ModelStore) -> None:
    """Another process saving right now (a job while ``--dump-weights`` runs beside it) keeps its directory."""
    store.save(generate_weights(cfg), cfg, METRICS, version=V1)
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tmp = store.root / f".tmp-{V2}-{writer.pid}"
        tmp.mkdir()
        assert store.clean_partial() == [] and tmp.is_dir()
        assert store.load_for_service(cfg).version == V1  # type: ignore[union-attr]
        assert tmp.is_dir() and store.versions() == [V1]
    finally:
        writer.kill()
        writer.wait()
    assert store.clean_partial() == [tmp.name] and not tmp.exists()
    own = store.root / f".tmp-{V2}-{os.getpid()}"  # left by a failed save of this very process
    own.mkdir()
    assert store.clean_partial() == [own.name]


def test_corrupt_newest_model_is_refused_and_the_previous_served(cfg: Config, store: ModelStore,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    w1 = perturbed(generate_weights(cfg), 0.1)
    store.save(w1, cfg, METRICS, version=V1)
    store.save(perturbed(w1, 0.2), cfg, METRICS, version=V2)
    assert store.load_for_service(cfg).version == V2  # type: ignore[union-attr]
    flip_byte(store.root / V2 / "weights.npz")
    with caplog.at_level(logging.ERROR, logger="cerebellar_norse.models"):
        model = store.load_for_service(cfg)
    assert model is not None and model.version == V1
    assert_same_weights(model.weights, w1)
    assert any("refusing corrupt model" in r.getMessage() and V2 in r.getMessage() for r in caplog.records)


def test_active_model_is_preferred_and_a_corrupt_active_falls_back(cfg: Config, store: ModelStore) -> None:
    w = generate_weights(cfg)
    for k, v in enumerate((V1, V2, V3)):
        store.save(perturbed(w, 0.1 * k), cfg, METRICS, version=v)
    store.set_active(V1)
    assert store.load_for_service(cfg).version == V1  # type: ignore[union-attr]
    (store.root / V1 / "metrics.json").write_text("{}")
    assert store.load_for_service(cfg).version == V3  # type: ignore[union-attr]
    store.set_active("20200101T000000Z-gone00")  # names a model that is not there
    assert store.load_for_service(cfg).version == V3  # type: ignore[union-attr]
    shutil.rmtree(store.root / V3)
    shutil.rmtree(store.root / V2)
    assert store.load_for_service(cfg) is None  # nothing valid: the caller serves the untrained network


def test_model_of_another_shape_is_skipped(cfg: Config, store: ModelStore, make_config: ConfigFactory,
                                           caplog: pytest.LogCaptureFixture) -> None:
    store.save(generate_weights(cfg), cfg, METRICS, version=V1)
    bigger = make_config(neural={**TINY_NEURAL, "granule_size": 96})
    store.save(generate_weights(bigger), bigger, METRICS, version=V2)
    store.set_active(V2)
    with caplog.at_level(logging.WARNING, logger="cerebellar_norse.models"):
        model = store.load_for_service(cfg)
    assert model is not None and model.version == V1
    assert any("does not fit this config" in r.getMessage() and "granule_size" in r.getMessage() for r in caplog.records)
    assert store.load_for_service(bigger).version == V2  # type: ignore[union-attr]


def test_verify_tree_reports_every_problem(cfg: Config, store: ModelStore) -> None:
    w = generate_weights(cfg)
    for v in (V1, V2):
        store.save(w, cfg, METRICS, version=v)
    flip_byte(store.root / V2 / "metrics.json")
    ok, problems = verify_tree(store.root.parent)
    assert ok == [f"{store.root / V1}: model {V1} OK"]
    assert len(problems) == 1 and str(store.root / V2 / "metrics.json") in problems[0]
    assert verify_tree(store.root / "nothing-here")[1]


def test_verify_data_reports_a_dangling_or_looping_state_link(cfg: Config, store: ModelStore, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The service moves an unreadable market_state.bin (a link to nothing included) aside at start and every market
    starts from rest; --verify-data skipped such a link without a word (exit 0 beside a good model)."""
    store.save(generate_weights(cfg), cfg, METRICS, version=V1)
    state = store.root.parent / "market_state.bin"
    state.symlink_to(store.root.parent / "gone.bin")
    ok, problems = verify_tree(store.root.parent)
    assert ok == [f"{store.root / V1}: model {V1} OK"]
    (problem,) = problems
    assert problem.startswith(f"{state}: a dangling symbolic link") and "gone.bin" in problem
    assert cmd_verify_data(str(store.root.parent)) == 1
    err = capsys.readouterr().err
    assert f"cerebellar-norse: {state}: a dangling symbolic link" in err
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "market_state.bin").symlink_to("market_state.bin")  # a link to itself: a loop
    assert cmd_verify_data(str(alone)) == 1
    err = capsys.readouterr().err
    assert "that loops" in err and "no models or state files found" not in err


def test_verify_data_reports_an_active_file_naming_no_stored_model(cfg: Config, store: ModelStore,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The service falls back to the newest valid model (/health degraded) when models/ACTIVE names a model that is not
    stored, or is no version at all; --verify-data said everything was OK (exit 0)."""
    store.save(generate_weights(cfg), cfg, METRICS, version=V1)
    active = store.root / "ACTIVE"
    for content, words in ((f"{V2}\n", f"names model {V2}, which is not stored"),
                           ("../elsewhere\n", "does not name a model version")):
        active.write_text(content)
        ok, problems = verify_tree(store.root.parent)
        assert ok == [f"{store.root / V1}: model {V1} OK"]
        assert len(problems) == 1 and problems[0].startswith(f"{active}: {words}"), problems
        assert cmd_verify_data(str(store.root.parent)) == 1
        assert f"{active}: {words}" in capsys.readouterr().err
    store.set_active(V1)
    assert verify_tree(store.root.parent)[1] == []
    assert cmd_verify_data(str(store.root.parent)) == 0


# --------------------------------------------------------------------------------------
# Index arrays: the kernels read them without bounds checks, so a model must name real cells
# --------------------------------------------------------------------------------------


def _swap_rows(w: Weights) -> None:
    """The first and last CSR entries (of different granule cells) trade places in pf_src and pf_post.

    Every index stays in range and pf_src stays a permutation; only the rows no longer match pf_pre.
    """
    w.pf_src[[0, -1]] = w.pf_src[[-1, 0]]
    w.pf_post[[0, -1]] = w.pf_post[[-1, 0]]


def _set(name: str, value: object, at: object = slice(None)) -> Callable[[Weights], None]:
    def apply(w: Weights) -> None:
        getattr(w, name)[at] = value
    return apply


def _retype(name: str, dtype: type) -> Callable[[Weights], None]:
    def apply(w: Weights) -> None:
        setattr(w, name, getattr(w, name).astype(dtype))
    return apply


# (array named in the message, words of the message, change): one case per invariant the kernels rely on
BAD_INDICES: dict[str, tuple[str, str, Callable[[Weights], None]]] = {
    "mg_idx past the mossy fibres": ("mg_idx[3, 1] = 12 ", "0 <= mg_idx < 12", _set("mg_idx", 12, (3, 1))),
    "mg_idx negative": ("mg_idx[0, 0] = -1 ", "out of range", _set("mg_idx", -1, (0, 0))),
    "mg_idx repeated in a row": ("mg_idx[5]", "twice", lambda w: w.mg_idx.__setitem__((5, 1), w.mg_idx[5, 0])),
    "mg_idx of floats": ("mg_idx", "integer type", _retype("mg_idx", np.float64)),
    "pf_pre past the granule cells": ("pf_pre[2, 4] = 64 ", "0 <= pf_pre < 64", _set("pf_pre", 64, (2, 4))),
    "pf_pre repeated in a row": ("pf_pre[1]", "twice", lambda w: w.pf_pre.__setitem__((1, 3), w.pf_pre[1, 2])),
    "pf_ptr not from 0": ("pf_ptr[0] = 1", "expected 0", _set("pf_ptr", 1, 0)),
    "pf_ptr not to P*C": ("pf_ptr[64] = 95", "expected 96", _set("pf_ptr", 95, -1)),
    "pf_ptr decreasing": ("pf_ptr[", "never decrease", _set("pf_ptr", 10**9, 7)),
    "pf_ptr of floats": ("pf_ptr", "integer type", _retype("pf_ptr", np.float32)),
    "pf_post far out": ("pf_post[0] = 1073741824 ", "0 <= pf_post < 6", _set("pf_post", 2**30)),
    "pf_post negative": ("pf_post[9] = -1 ", "out of range", _set("pf_post", -1, 9)),
    "pf_post not the synapse's cell": ("pf_post[4] = ", "is a synapse of Purkinje cell",
                                       lambda w: w.pf_post.__setitem__(4, (w.pf_post[4] + 1) % 6)),
    "pf_src far out": ("pf_src[0] = 1000000000 ", "0 <= pf_src < 96", _set("pf_src", 10**9)),
    "pf_src negative": ("pf_src[3] = -2 ", "out of range", _set("pf_src", -2, 3)),
    "pf_src repeated": ("pf_src", "more than once", lambda w: w.pf_src.__setitem__(1, w.pf_src[0])),
    "pf_src in another granule cell's row": ("pf_src[0]", "CSR row of granule cell", _swap_rows),
    "pf_src of unsigned 64-bit": ("pf_src[0] = 18446744073709551615", "out of range",
                                  lambda w: setattr(w, "pf_src", np.full(w.pf_src.shape, 2**64 - 1, dtype=np.uint64))),
    "mg_idx of one dimension": ("mg_idx", "two dimensions", lambda w: setattr(w, "mg_idx", w.mg_idx.reshape(-1))),
}


@pytest.mark.parametrize("case", BAD_INDICES.values(), ids=BAD_INDICES.keys())
def test_index_arrays_are_range_and_consistency_checked(cfg: Config, case: tuple[str, str, Callable[[Weights], None]]) -> None:
    named, words, change = case
    w = generate_weights(cfg)
    check_weights(w, "generated")  # the generated network is valid
    change(w)
    with pytest.raises(CheckpointError) as exc:
        check_weights(w, "crafted")
    message = str(exc.value)
    assert message.startswith("crafted: ") and named in message and words in message, message


def test_a_model_with_bad_indices_is_refused_on_load_and_the_previous_served(cfg: Config, store: ModelStore,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Saved with correct checksums (anyone can write a manifest): the load still refuses it, naming the array."""
    store.save(generate_weights(cfg), cfg, METRICS, version=V1)
    crafted = generate_weights(cfg)
    crafted.pf_src[:] = 10**9
    store.save(crafted, cfg, METRICS, version=V2)
    with pytest.raises(CheckpointError, match=r"pf_src\[0\] = 1000000000 is out of range") as exc:
        store.load(V2)
    assert exc.value.path == str(store.root / V2 / "weights.npz")
    store.set_active(V2)
    with caplog.at_level(logging.ERROR, logger="cerebellar_norse.models"):
        model = store.load_for_service(cfg)
    assert model is not None and model.version == V1
    assert store.fallback is not None and "pf_src" in store.fallback
    assert cmd_validate_model(str(store.root / V2)) == 1


@pytest.mark.parametrize("arrays", [{"golgi_init": np.zeros(3)}, {"golgi_init": np.array("x")},
                                    {"head_gain": np.array(["1", "1", "1"])}, {"golgi_init": np.array(np.inf)}],
                         ids=["golgi_init of three", "golgi_init text", "head_gain text", "golgi_init infinite"])
def test_scalars_and_heads_of_the_wrong_type_are_refused(cfg: Config, arrays: dict[str, np.ndarray]) -> None:
    w = generate_weights(cfg)
    good = {k: getattr(w, k) for k in (*WEIGHT_FIELDS, "head_gain", "head_bias")}
    buf = io.BytesIO()
    np.savez(buf, **{**good, "golgi_init": np.array(w.golgi_init), **arrays})
    with pytest.raises(CheckpointError) as exc:
        weights_from_bytes(buf.getvalue(), "weights.npz")
    assert next(iter(arrays)) in str(exc.value)


def test_a_model_that_cannot_be_served_falls_back_to_the_next(cfg: Config, store: ModelStore,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """``usable`` (the caller building its engine) raising makes that model unusable, like a corrupt one."""
    w = generate_weights(cfg)
    for k, v in enumerate((V1, V2, V3)):
        store.save(perturbed(w, 0.1 * k), cfg, METRICS, version=v)
    store.set_active(V2)
    tried: list[str] = []

    def build(model: StoredModel) -> None:
        tried.append(model.version)
        if model.version != V1:
            raise IndexError(f"index 1000000000 is out of bounds ({model.version})")

    with caplog.at_level(logging.ERROR, logger="cerebellar_norse.models"):
        model = store.load_for_service(cfg, usable=build)
    assert model is not None and model.version == V1 and tried == [V2, V3, V1]
    assert store.fallback == f"active model {V2} cannot be served (IndexError: index 1000000000 is out of bounds ({V2}))"
    assert [r.getMessage() for r in caplog.records if "cannot be served" in r.getMessage()] == [
        f"refusing model {v}: it cannot be served (IndexError: index 1000000000 is out of bounds ({v}))" for v in (V2, V3)]
    assert store.load_for_service(cfg, usable=lambda m: None).version == V2  # type: ignore[union-attr]
    assert store.fallback is None


# --------------------------------------------------------------------------------------
# The CLI: --validate-model, --verify-data, --dump-weights (real subprocesses, run side by side)
# --------------------------------------------------------------------------------------


def test_validate_model_takes_one_model_dir_or_a_dir_of_models(cfg: Config, store: ModelStore, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    store.save(generate_weights(cfg), cfg, METRICS, version=V1)
    assert cmd_validate_model(str(store.root / V1)) == 0
    assert f"model {V1} OK (64 granule, 6 Purkinje, 6 DCN)" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert cmd_validate_model(str(tmp_path / "empty")) == 1
    assert "no model directory found" in capsys.readouterr().err
    assert cmd_verify_data(str(tmp_path / "empty")) == 1
    assert "no models or state files found" in capsys.readouterr().err


def test_verify_data_and_validate_model_say_a_path_is_missing_or_a_file(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A regular file was "no models or state files found" / "no model directory found", as was a missing path."""
    file = tmp_path / "market_state.bin"
    file.write_bytes(b"x")
    missing = tmp_path / "nowhere"
    for path, why in ((file, "is not a directory"), (missing, "does not exist")):
        assert cmd_verify_data(str(path)) == 1
        err = capsys.readouterr().err
        assert f"{path}: {why} (fix: pass the state dir" in err and "no models" not in err, err
        assert cmd_validate_model(str(path)) == 1
        err = capsys.readouterr().err
        assert f"{path}: {why} (fix: pass a model directory, the one holding manifest.json," in err, err
        assert "no model directory found" not in err


def run_clis(calls: dict[str, tuple[list[str], Path]]) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run ``cerebellar-norse ARGS`` for each call at once (state dir from the environment); wait for all."""
    procs = {key: subprocess.Popen([sys.executable, "-m", "cerebellar_norse.cli", *args], cwd=REPO_ROOT,
                                   env=server_environ(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for key, (args, state) in calls.items()}
    out = {}
    for key, p in procs.items():
        stdout, stderr = p.communicate(timeout=120)
        out[key] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    return out


@pytest.fixture
def default_models(tmp_path: Path, make_config: ConfigFactory) -> tuple[Path, Path, Weights]:
    """Two state dirs of the built-in default network: ``good`` (one model) and ``bad`` (a good and a corrupt one)."""
    default = make_config(state_dir=tmp_path / "good")
    w = perturbed(generate_weights(default), 0.05)
    ModelStore(tmp_path / "good").save(w, default, METRICS, version=V1)
    bad = ModelStore(tmp_path / "bad")
    bad.save(w, default, METRICS, version=V1)
    bad.save(w, default, METRICS, version=V2)
    flip_byte(bad.root / V2 / "weights.npz")
    return tmp_path / "good", tmp_path / "bad", w


def test_cli_validate_model_and_verify_data(default_models: tuple[Path, Path, Weights]) -> None:
    good, bad, _ = default_models
    corrupt = bad / "models" / V2 / "weights.npz"
    r = run_clis({
        "validate_good": (["--validate-model", str(good / "models")], good),
        "validate_bad": (["--validate-model", str(bad / "models")], bad),
        "verify_good": (["--verify-data", str(good)], good),
        "verify_bad": (["--verify-data", str(bad)], bad),
    })
    for key in ("validate_good", "verify_good"):
        assert r[key].returncode == 0, (key, r[key].stderr)
        assert f"model {V1} OK" in r[key].stdout
        assert r[key].stderr == ""
    for key in ("validate_bad", "verify_bad"):
        res = r[key]
        assert res.returncode == 1, (key, res.stdout, res.stderr)
        assert str(corrupt) in res.stderr and "checksum mismatch" in res.stderr, res.stderr
        assert f"model {V1} OK" in res.stdout  # the good one is still listed
        assert "Traceback" not in res.stderr


def test_dump_weights_text_and_json(default_models: tuple[Path, Path, Weights], monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    good, _, w = default_models
    for k in [k for k in os.environ if k.startswith("CEREBELLAR_NORSE_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("CEREBELLAR_NORSE_PATHS__STATE_DIR", str(good))

    assert cli.main(["--dump-weights"]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert text.splitlines()[0] == f"model {V1}"
    assert captured.err == ""  # a stored model is dumped without the untrained network's note
    # every layer analyze-weights names, the calibrated head included (a zero head gain serves the class priors only)
    for layer in ("mossy_granule", "parallel_fibre_purkinje", "purkinje_bias", "mossy_dcn", "purkinje_dcn", "dcn_bias",
                  "dcn_readout", "head_gain", "head_bias"):
        assert any(line.split()[:1] == [layer] for line in text.splitlines()), layer
    assert "mean" in text and "std" in text

    assert cli.main(["--dump-weights", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model_version"] == V1
    assert doc["layers"]["head_gain"]["count"] == 3
    assert doc["layers"]["head_gain"]["mean"] == pytest.approx(float(np.mean(w.head_gain)))
    pf = doc["layers"]["parallel_fibre_purkinje"]
    assert set(pf) >= {"count", "mean", "std", "min", "max"}
    assert pf["count"] == w.pf_w.size
    assert pf["mean"] == pytest.approx(float(np.mean(w.pf_w.astype(np.float64))))
    assert pf["max"] == pytest.approx(float(w.pf_w.max()))


def test_a_model_that_cannot_be_written_is_a_storage_error_naming_the_file(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while a model is saved: the file is named, and no partial directory stays behind."""
    import errno

    import cerebellar_norse.training.checkpoints as ckpt
    from cerebellar_norse.config import load_config
    from cerebellar_norse.errors import StorageError

    cfg = load_config(None, environ={})
    store = ModelStore(tmp_path / "state")
    real = ckpt.atomic_write_bytes

    def full(path: Path, data: bytes) -> None:
        if path.name == "metrics.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(ckpt, "atomic_write_bytes", full)
    with pytest.raises(StorageError) as info:
        store.save(generate_weights(cfg), cfg, {"validation": {"loss": 1.0}}, version="20250101T000000Z-full00")
    assert str(info.value).startswith("cannot store the model: writing failed at ")
    assert "metrics.json: No space left on device (errno 28 ENOSPC)" in str(info.value)
    assert sorted(p.name for p in store.root.iterdir()) == [] and store.versions() == []


def unprivileged() -> list[str]:
    """The command prefix that makes a child obey file permissions: as root (which reads anything), ``setpriv``
    without the capabilities that let it; the test is skipped as root without ``setpriv``."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search", "--"]


def test_a_model_file_the_service_may_not_read_stops_the_start_in_one_line_and_verify_data_says_so(
        default_models: tuple[Path, Path, Weights]) -> None:
    """Permissions on a stored model's file (a restore from backup without chown): the start refused nothing and served
    the untrained network instead, moving aside the market states saved with the model; it now exits 1 with one line
    naming the file and the errno, before the state dir is touched, and --verify-data says the same."""
    import socket

    prefix = unprivileged()
    good, _, _ = default_models
    state = good.parent / "model-locked"
    shutil.copytree(good, state)
    locked = state / "models" / V1 / "weights.npz"
    locked.chmod(0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = sorted(p.relative_to(state) for p in state.rglob("*"))
    try:
        verify, serve = (subprocess.run([*prefix, sys.executable, "-m", "cerebellar_norse.cli", *args], cwd=REPO_ROOT,
                                        env=server_environ(state), capture_output=True, text=True, timeout=120)
                         for args in (["--verify-data", str(state)], ["--port", str(port)]))
    finally:
        locked.chmod(0o644)
    said = (f"cerebellar-norse: cannot read model file {locked}: Permission denied (errno 13 EACCES): the service does "
            "not start on a model it cannot read (nothing is moved aside): make it readable by the service's user (e.g. "
            "chown) and start again")
    assert serve.returncode == 1 and serve.stderr.strip().splitlines() == [said], serve.stdout[-2000:] + serve.stderr
    assert "Traceback" not in serve.stdout + serve.stderr
    assert verify.returncode == 1 and said in verify.stderr.splitlines(), verify.stderr
    after = sorted(p.relative_to(state) for p in state.rglob("*") if p.name != ".lock")  # (the state dir's lock)
    assert after == before  # nothing written, nothing moved aside


def test_verify_data_names_what_it_cannot_read_as_unreadable_and_says_what_the_start_does(
        default_models: tuple[Path, Path, Weights]) -> None:
    """Permissions (a restore from backup without chown): a directory it cannot list is "cannot read", never "cannot
    write"; an unreadable state-id is what the start refuses (nothing moved aside), not a damaged one."""
    from cerebellar_norse.engine.state_dir import STATE_ID_FILE, write_state_id

    prefix = unprivileged()
    good, _, _ = default_models
    models, ident = good.parent / "models-locked", good.parent / "id-locked"
    shutil.copytree(good, models)
    shutil.copytree(good, ident)
    write_state_id(ident, "0123456789abcdef0123456789abcdef")
    (models / "models").chmod(0)
    (ident / STATE_ID_FILE).chmod(0)
    try:
        out = {state: subprocess.run([*prefix, sys.executable, "-m", "cerebellar_norse.cli", "--verify-data", str(state)],
                                     cwd=REPO_ROOT, env=server_environ(state), capture_output=True, text=True, timeout=120)
               for state in (models, ident)}
    finally:
        (models / "models").chmod(0o755)
        (ident / STATE_ID_FILE).chmod(0o600)
    res = out[models]
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "cannot write" not in res.stderr
    assert f"cerebellar-norse: cannot read {models / 'models'}" in res.stderr
    assert "Permission denied (errno 13 EACCES): nothing in it was verified" in res.stderr
    res = out[ident]
    assert res.returncode == 1, res.stderr
    assert (f"cerebellar-norse: cannot read the state dir identity {ident / STATE_ID_FILE}: Permission denied (errno 13 "
            "EACCES): the service does not start on it (nothing is moved aside)") in res.stderr
    assert "moves it aside" not in res.stderr


def test_a_manifest_naming_another_version_than_its_directory_is_refused_as_damaged(
        cfg: Config, store: ModelStore, capsys: pytest.CaptureFixture[str]) -> None:
    """A flipped bit in the manifest's version (it has no checksum of its own) was served as the model's name: one
    ``models/ACTIVE``, ``POST /models/<version>/activate`` and ``GET /models`` did not know, and ``--verify-data``
    said OK."""
    stored = store.save(generate_weights(cfg), cfg, METRICS)
    store.set_active(stored)
    mpath = store.root / stored / MANIFEST
    raw = bytearray(mpath.read_bytes())
    at = raw.index(stored.encode()) + len(stored) - 1
    raw[at] = ord("0") if raw[at] != ord("0") else ord("1")  # the last (hex) character of the version, still a version
    mpath.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"the manifest names model .*, not .*, the directory it is stored in") as exc:
        store.load(stored)
    assert exc.value.path == str(mpath)
    assert load_model_dir(store.root / stored).version != stored  # a model directory checked alone is what it says
    assert cmd_verify_data(str(store.root.parent)) == 1
    assert f"{mpath}: the manifest names model" in capsys.readouterr().err
    assert mpath.read_bytes() == bytes(raw)  # left as it is
    raw = bytearray(mpath.read_bytes().replace(b'"version"', b'"vershon"'))  # a flipped bit in the key: no version
    mpath.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"the manifest names no model version, not .*, the directory"):
        store.load(stored)


@pytest.mark.slow
@pytest.mark.parametrize(("target", "special"), [
    ("market_state.bin", "fifo"), ("state-id", "/dev/zero"), ("models/ACTIVE", "fifo"),
    ("models/{v}/manifest.json", "/dev/zero"), ("models/{v}/manifest.json", "fifo"), ("models/{v}/weights.npz", "fifo")])
def test_verify_data_names_a_state_file_that_is_a_fifo_or_a_device_instead_of_waiting_on_it(
        cfg: Config, store: ModelStore, target: str, special: str) -> None:
    """--verify-data (and the service's start) waited for a writer for ever on a FIFO where market_state.bin,
    state-id, models/ACTIVE or a manifest goes, and read a link to /dev/zero until memory ran out."""
    from cerebellar_norse.engine.state_dir import write_state_id

    version = store.save(generate_weights(cfg), cfg, METRICS)
    store.set_active(version)
    state_dir = store.root.parent
    write_state_id(state_dir, "0123456789abcdef0123456789abcdef")
    path = state_dir / target.format(v=version)
    path.unlink(missing_ok=True)
    if special == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(special)
    res = subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", "--verify-data", str(state_dir)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 1, res.stderr
    assert f"{path}: " in res.stderr and "not a regular file" in res.stderr and "Traceback" not in res.stderr


def test_validate_model_names_a_directory_it_may_not_list_as_unreadable(
        cfg: Config, store: ModelStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A models directory the user may not list was said as `cannot write …/models/manifest.json: Permission denied`:
    a write, of a file that is not there."""
    store.save(generate_weights(cfg), cfg, METRICS)
    real = Path.exists

    def denied(p: Path, *a: object, **k: object) -> bool:  # (the tests run as root, whom chmod does not stop)
        if p.parent == store.root:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(p))
        return real(p)

    monkeypatch.setattr(Path, "exists", denied)
    assert cmd_validate_model(str(store.root)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cerebellar-norse: cannot read {store.root}: Permission denied (errno 13 EACCES): nothing in it "
                          "was verified")
