"""GET /models' listing of the model store (``ModelStore.summaries``): every model verified, each once while its
files stay as they are, so that a listing of many large models costs a directory scan after the first."""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from cerebellar_norse.config import Config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.training import checkpoints
from cerebellar_norse.training.checkpoints import ModelStore, StoredModel

V1, V2, V3 = "20240101T000000Z-aaaaaa", "20240102T000000Z-bbbbbb", "20240103T000000Z-cccccc"


@pytest.fixture
def store(cfg: Config) -> ModelStore:
    s = ModelStore(Path(cfg.paths.state_dir))
    for k, v in enumerate((V1, V2)):
        s.save(generate_weights(cfg), cfg, {"validation": {"loss": 0.9 + k}}, version=v)
    return s


def counting(store: ModelStore, monkeypatch: pytest.MonkeyPatch,
             fail: Callable[[str], BaseException | None] = lambda v: None) -> list[str]:
    """The versions ``store.load`` is called for from now on (raising ``fail(version)`` when it is not None)."""
    loaded: list[str] = []
    real = store.load

    def load(version: str) -> StoredModel:
        loaded.append(version)
        exc = fail(version)
        if exc is not None:
            raise exc
        return real(version)

    monkeypatch.setattr(store, "load", load)
    return loaded


def test_each_model_is_verified_once_while_its_files_stay_as_they_are(
        store: ModelStore, cfg: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoints, "SETTLED_NS", 0)  # (files written a moment ago count as settled)
    loaded = counting(store, monkeypatch)
    first = store.summaries()
    assert [(m.version, m.error, m.metrics["validation"]) for m in first] == [(V1, None, {"loss": 0.9}),
                                                                            (V2, None, {"loss": 1.9})]
    assert loaded == [V1, V2]
    assert store.summaries() == first and loaded == [V1, V2]  # nothing read again
    weights = store.root / V2 / "weights.npz"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # damaged in place, same size
    weights.write_bytes(bytes(data))
    damaged = store.summaries()
    assert loaded == [V1, V2, V2]
    assert damaged[0] == first[0] and damaged[1].error is not None and "weights.npz" in damaged[1].error
    assert store.summaries() == damaged and loaded == [V1, V2, V2]  # a failed checksum stays failed: not read again
    store.save(generate_weights(cfg), cfg, {"validation": {"loss": 3.0}}, version=V3)
    shutil.rmtree(store.root / V1)
    assert [m.version for m in store.summaries()] == [V2, V3] and loaded == [V1, V2, V2, V3]
    assert set(store._summaries) == {V2, V3}  # a deleted model is forgotten


def test_a_model_stored_moments_ago_or_unreadable_for_now_is_verified_again(
        store: ModelStore, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = counting(store, monkeypatch)
    store.summaries()
    store.summaries()
    assert loaded == [V1, V2, V1, V2]  # written within SETTLED_NS: a change in the same timestamp tick may not show
    monkeypatch.setattr(checkpoints, "SETTLED_NS", 0)
    short = [OSError(errno.EMFILE, "Too many open files")]
    loaded = counting(store, monkeypatch, lambda v: short.pop() if v == V1 and short else None)
    listed = store.summaries()
    assert listed[0].error == "[Errno 24] Too many open files" and listed[1].error is None
    listed = store.summaries()
    assert loaded == [V1, V2, V1] and listed[0].error is None  # the shortage was not remembered as a verdict
