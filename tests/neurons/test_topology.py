"""Topology and weights: seeded, reproducible, well-formed, CSR consistent with the dense layout."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from cerebellar_norse.config import N_CLASSES, Config
from cerebellar_norse.neurons.parameters import network_shape
from cerebellar_norse.neurons.topology import Weights, generate_weights

INDEX_FIELDS = ("mg_idx", "pf_pre", "pf_ptr", "pf_post", "pf_src")
FLOAT_FIELDS = ("mg_w", "pf_w", "pc_bias", "w_md", "w_pd", "dcn_bias", "w_out")
HEAD_FIELDS = ("head_gain", "head_bias")  # float64 whatever the network's precision
ConfigFactory = Any


def _array_fields(w: Weights) -> dict[str, np.ndarray]:
    return {f.name: getattr(w, f.name) for f in dataclasses.fields(w) if isinstance(getattr(w, f.name), np.ndarray)}


@pytest.fixture
def default_config(make_config: ConfigFactory) -> Config:
    cfg: Config = make_config()
    return cfg


def test_every_field_is_covered(default_config: Config) -> None:
    w = generate_weights(default_config)
    assert set(_array_fields(w)) == set(INDEX_FIELDS) | set(FLOAT_FIELDS) | set(HEAD_FIELDS)
    assert {f.name for f in dataclasses.fields(w)} == set(INDEX_FIELDS) | set(FLOAT_FIELDS) | set(HEAD_FIELDS) | {"golgi_init"}
    assert w.head_is_identity  # a generated network serves its own probabilities
    h = w.with_head(np.array([0.0, 2.0, 0.0]), np.array([0.1, 0.2, 0.3]))
    assert not h.head_is_identity and w.head_is_identity and h.pf_w is w.pf_w
    assert h.head_gain.dtype == np.float64 and h.copy().head_bias.tolist() == [0.1, 0.2, 0.3]


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_same_seed_gives_bit_identical_weights(make_config: ConfigFactory, precision: str) -> None:
    cfg = make_config({"precision": precision})
    a, b = generate_weights(cfg), generate_weights(cfg)
    for name, arr in _array_fields(a).items():
        other = getattr(b, name)
        assert arr.dtype == other.dtype, name
        assert arr.shape == other.shape, name
        assert arr.tobytes() == other.tobytes(), f"{name} differs between two generations of the same seed"
    assert a.golgi_init == b.golgi_init


def test_different_seed_gives_a_different_network(make_config: ConfigFactory) -> None:
    a = generate_weights(make_config({"seed": 1}))
    b = generate_weights(make_config({"seed": 2}))
    assert not np.array_equal(a.mg_idx, b.mg_idx)
    assert not np.array_equal(a.pf_pre, b.pf_pre)
    assert not np.array_equal(a.pf_w, b.pf_w)


def test_float32_and_float64_networks_share_their_topology(make_config: ConfigFactory) -> None:
    w32 = generate_weights(make_config({"precision": "float32"}))
    w64 = generate_weights(make_config({"precision": "float64"}))
    for name in INDEX_FIELDS:
        np.testing.assert_array_equal(getattr(w32, name), getattr(w64, name), err_msg=name)
        assert getattr(w32, name).dtype == getattr(w64, name).dtype, name
    for name in FLOAT_FIELDS:
        a32, a64 = getattr(w32, name), getattr(w64, name)
        assert a32.dtype == np.float32 and a64.dtype == np.float64, name
        # drawn in float64, rounded once to float32
        np.testing.assert_array_equal(a32, a64.astype(np.float32), err_msg=name)
    assert w32.golgi_init == w64.golgi_init


def _check_shapes_and_dtypes(cfg: Config, w: Weights) -> None:
    s = network_shape(cfg.neural)
    G, M, D, P, C, N, K = s.granule, s.mossy, s.dendrites, s.purkinje, s.pf_per_purkinje, s.dcn, s.classes
    fdt = np.float32 if cfg.neural.precision == "float32" else np.float64
    expected = {
        "mg_idx": ((G, D), np.int32),
        "mg_w": ((G, D), fdt),
        "pf_pre": ((P, C), np.int32),
        "pf_w": ((P, C), fdt),
        "pc_bias": ((P,), fdt),
        "w_md": ((N, M), fdt),
        "w_pd": ((N, P), fdt),
        "dcn_bias": ((N,), fdt),
        "w_out": ((K, N), fdt),
        "pf_ptr": ((G + 1,), np.int64),
        "pf_post": ((P * C,), np.int32),
        "pf_src": ((P * C,), np.int64),
    }
    for name, (shape, dtype) in expected.items():
        arr = getattr(w, name)
        assert arr.shape == shape, f"{name}: shape {arr.shape}, expected {shape}"
        assert arr.dtype == dtype, f"{name}: dtype {arr.dtype}, expected {np.dtype(dtype)}"
        if arr.dtype.kind == "f":
            assert np.isfinite(arr).all(), name
    assert K == N_CLASSES
    assert w.shape == s
    assert isinstance(w.golgi_init, float) and np.isfinite(w.golgi_init) and w.golgi_init >= 0.0


def _check_connectivity(cfg: Config, w: Weights) -> None:
    s = network_shape(cfg.neural)
    # mossy -> granule: D distinct fibres per granule cell, sorted, in range
    assert (w.mg_idx >= 0).all() and (w.mg_idx < s.mossy).all()
    if s.dendrites > 1:
        assert (np.diff(w.mg_idx, axis=1) > 0).all(), "dendrite mossy indices must be distinct and sorted"
    # granule -> Purkinje: exactly C distinct granule inputs per Purkinje cell, sorted, in range
    assert (w.pf_pre >= 0).all() and (w.pf_pre < s.granule).all()
    for p in range(s.purkinje):
        assert len(np.unique(w.pf_pre[p])) == s.pf_per_purkinje, f"Purkinje cell {p}"
    if s.pf_per_purkinje > 1:
        assert (np.diff(w.pf_pre, axis=1) > 0).all()
    # signs as documented: excitatory dendrites, inhibitory magnitudes >= 0
    assert (w.mg_w > 0).all()
    assert (w.pf_w >= 0).all()
    assert (w.w_md >= 0).all()
    assert (w.w_pd >= 0).all()


def _check_csr(w: Weights) -> None:
    s = w.shape
    nnz = s.purkinje * s.pf_per_purkinje
    ptr, post, src = w.pf_ptr, w.pf_post, w.pf_src
    assert ptr[0] == 0 and ptr[-1] == nnz
    assert (np.diff(ptr) >= 0).all()
    np.testing.assert_array_equal(np.sort(src), np.arange(nnz))  # a permutation of the synapses
    np.testing.assert_array_equal(np.diff(ptr), np.bincount(w.pf_pre.reshape(-1), minlength=s.granule))
    # rebuild the dense (G, P) matrix from both layouts
    dense_pre = np.zeros((s.granule, s.purkinje), dtype=np.float64)
    for p in range(s.purkinje):
        for c in range(s.pf_per_purkinje):
            dense_pre[w.pf_pre[p, c], p] = w.pf_w[p, c]
    dense_csr = np.zeros_like(dense_pre)
    seen = np.zeros_like(dense_pre, dtype=bool)
    flat_w = w.pf_w.reshape(-1)
    csr_w = w.pf_w_csr()
    for g in range(s.granule):
        for e in range(ptr[g], ptr[g + 1]):
            assert w.pf_pre.reshape(-1)[src[e]] == g, f"CSR entry {e} is not a synapse of granule cell {g}"
            assert post[e] == src[e] // s.pf_per_purkinje
            assert not seen[g, post[e]], f"duplicate synapse {g}->{post[e]}"
            seen[g, post[e]] = True
            assert csr_w[e] == flat_w[src[e]]
            dense_csr[g, post[e]] = csr_w[e]
    np.testing.assert_array_equal(dense_csr, dense_pre)
    assert int(seen.sum()) == nnz


TOPOLOGY_CASES = {
    "default": {},
    "default-float64": {"precision": "float64"},
    "tiny": {"mossy_size": 6, "granule_size": 16, "granule_dendrites": 2, "purkinje_size": 3,
             "connections_per_neuron": 4, "dcn_size": 3, "target_sparsity": 0.125},
    # every granule cell needs all mossy fibres, every Purkinje cell all granule cells: the
    # duplicate-redraw loop must still end with distinct indices
    "saturated": {"mossy_size": 6, "granule_size": 24, "granule_dendrites": 6, "purkinje_size": 5,
                  "connections_per_neuron": 24, "dcn_size": 3, "target_sparsity": 0.1},
    "one-dendrite": {"granule_dendrites": 1, "connections_per_neuron": 1},
}


@pytest.mark.parametrize("case", sorted(TOPOLOGY_CASES))
def test_arrays_are_well_formed(make_config: ConfigFactory, case: str) -> None:
    cfg = make_config(TOPOLOGY_CASES[case])
    w = generate_weights(cfg)
    _check_shapes_and_dtypes(cfg, w)
    _check_connectivity(cfg, w)
    _check_csr(w)


def test_copy_is_deep_and_astype_keeps_topology(default_config: Config) -> None:
    w = generate_weights(default_config)
    c = w.copy()
    for name, arr in _array_fields(w).items():
        np.testing.assert_array_equal(getattr(c, name), arr)
        assert not np.shares_memory(getattr(c, name), arr), name
    c.pf_w[0, 0] += 1.0
    assert c.pf_w[0, 0] != w.pf_w[0, 0]
    w64 = w.astype(np.dtype(np.float64))
    for name in INDEX_FIELDS:
        np.testing.assert_array_equal(getattr(w64, name), getattr(w, name))
    for name in FLOAT_FIELDS:
        assert getattr(w64, name).dtype == np.float64
        np.testing.assert_array_equal(getattr(w64, name).astype(np.float32), getattr(w, name))
