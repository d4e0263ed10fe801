"""The named layouts of the fused kernel's flat arrays (coef, dims, wf, wi) are complete and used as named."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from norse.torch.functional.leaky_integrator import LIParameters
from norse.torch.functional.lif import LIFParameters

from cerebellar_norse.config import Config
from cerebellar_norse.neurons import layout
from cerebellar_norse.neurons.fused import PackedWeights, make_dims
from cerebellar_norse.neurons.layout import (
    C_DN,
    C_GR,
    C_LEAK,
    C_MEM,
    C_PC,
    C_RESET,
    C_RO,
    C_SYN,
    C_TH,
    DIMS_STARTS,
    N_COEF,
    N_DIMS,
    WF_SEGMENTS,
    WI_SEGMENTS,
    PackedLayout,
)
from cerebellar_norse.neurons.network import CerebellarNetwork
from cerebellar_norse.neurons.parameters import NetworkParameters, NetworkShape, kernel_coefficients
from cerebellar_norse.neurons.topology import generate_weights

ConfigFactory = Any

SHAPES = [
    NetworkShape(mossy=6, granule=16, purkinje=3, dcn=6, classes=3, dendrites=2, pf_per_purkinje=4),
    NetworkShape(mossy=24, granule=128, purkinje=8, dcn=6, classes=3, dendrites=4, pf_per_purkinje=32),
    NetworkShape(mossy=7, granule=1, purkinje=1, dcn=1, classes=3, dendrites=1, pf_per_purkinje=1),
    NetworkShape(mossy=48, granule=40_000, purkinje=128, dcn=12, classes=3, dendrites=4, pf_per_purkinje=256),
]

LIF_SLOTS = (C_MEM, C_SYN, C_LEAK, C_TH, C_RESET)
LI_SLOTS = (C_MEM, C_SYN, C_LEAK)
SCALAR_SLOTS = ("C_GOLGI_DECAY", "C_GOLGI_BASE", "C_GOLGI_RATE", "C_TARGET", "C_N_GRANULE", "C_READOUT_SCALE")


def _coef_slots() -> list[int]:
    return ([base + k for base in (C_GR, C_PC, C_DN) for k in LIF_SLOTS] + [C_RO + k for k in LI_SLOTS]
            + [getattr(layout, name) for name in SCALAR_SLOTS])


def _covered_once(slices: list[slice], size: int) -> np.ndarray:
    hits = np.zeros(size, dtype=np.int64)
    for sl in slices:
        assert sl.step is None and 0 <= sl.start <= sl.stop <= size
        hits[sl] += 1
    return hits


def test_coef_names_cover_every_slot_once() -> None:
    slots = _coef_slots()
    assert sorted(slots) == list(range(N_COEF))


def test_dims_names_cover_every_slot_once() -> None:
    names = [n for n in dir(layout) if n.startswith("D_") and n != "DENSE_PF_MAX"]
    assert sorted(getattr(layout, n) for n in names) == list(range(N_DIMS))
    assert len(DIMS_STARTS) == len(WF_SEGMENTS) + len(WI_SEGMENTS)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"G{s.granule}xP{s.purkinje}")
@pytest.mark.parametrize("dense", [True, False, None], ids=["dense", "csr", "default"])
def test_layout_tiles_wf_and_wi(shape: NetworkShape, dense: bool | None) -> None:
    lay = PackedLayout.of(shape, dense)
    assert lay.dense == (layout.uses_dense_rows(shape) if dense is None else dense)
    for names, size in ((WF_SEGMENTS, lay.wf_size), (WI_SEGMENTS, lay.wi_size)):
        slices = [lay.slice_of(n) for n in names]
        assert (_covered_once(slices, size) == 1).all()  # no gap, no overlap
        assert [sl.start for sl in slices[1:]] == [sl.stop for sl in slices[:-1]]  # storage order
        for name, sl in zip(names, slices, strict=True):
            assert sl.stop - sl.start == int(np.prod(lay.shape_of(name))), name
    assert (lay.pf_rows.stop - lay.pf_rows.start > 0) == lay.dense
    dims = lay.dims(slots=5)
    assert dims.shape == (N_DIMS,) and dims.dtype == np.int64
    assert [int(dims[d]) for d in DIMS_STARTS] == [lay.slice_of(n).start for n in WF_SEGMENTS + WI_SEGMENTS]
    assert int(dims[layout.D_DENSE]) == int(lay.dense) and int(dims[layout.D_SLOTS]) == 5
    np.testing.assert_array_equal(make_dims(shape, 5, dense), dims)
    with pytest.raises(KeyError):
        lay.slice_of("shape")


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("dense", [True, False], ids=["dense", "csr"])
def test_pack_puts_each_weight_where_the_layout_says(make_config: ConfigFactory, precision: str, dense: bool) -> None:
    cfg = make_config({"mossy_size": 24, "granule_size": 128, "purkinje_size": 8, "connections_per_neuron": 32,
                       "dcn_size": 6, "precision": precision})
    w = generate_weights(cfg)
    dt = np.dtype(precision)
    pw = PackedWeights.pack(w, dt, dense)
    lay = pw.layout
    assert pw.dense == dense and pw.wf.dtype == dt and pw.wi.dtype == np.int32
    assert pw.wf.shape == (lay.wf_size,) and pw.wi.shape == (lay.wi_size,)
    f = lambda name: pw.wf[lay.slice_of(name)].reshape(lay.shape_of(name))  # noqa: E731
    i = lambda name: pw.wi[lay.slice_of(name)].reshape(lay.shape_of(name))  # noqa: E731
    cast = lambda a: np.asarray(a, dtype=dt)  # noqa: E731
    np.testing.assert_array_equal(f("mg_w").T, cast(w.mg_w))
    np.testing.assert_array_equal(f("pc_bias"), cast(w.pc_bias))
    np.testing.assert_array_equal(f("w_md_t").T, cast(w.w_md))
    np.testing.assert_array_equal(f("w_pd_t").T, cast(w.w_pd))
    np.testing.assert_array_equal(f("dcn_bias"), cast(w.dcn_bias))
    np.testing.assert_array_equal(f("w_out"), cast(w.w_out))
    np.testing.assert_array_equal(i("mg_idx").T, w.mg_idx)
    np.testing.assert_array_equal(i("pf_ptr"), w.pf_ptr)
    np.testing.assert_array_equal(i("pf_post"), w.pf_post)
    # CSR back to (P, C) through pf_src.
    pf_w = np.empty(w.pf_w.size, dtype=dt)
    pf_w[w.pf_src] = f("pf_w")
    np.testing.assert_array_equal(pf_w.reshape(w.pf_w.shape), cast(w.pf_w))
    rows = f("pf_rows")
    s = w.shape
    if dense:
        post = np.repeat(np.arange(s.purkinje), s.pf_per_purkinje)
        np.testing.assert_array_equal(rows[w.pf_pre.reshape(-1), post], cast(w.pf_w).reshape(-1))
        mask = np.ones((s.granule, s.purkinje), dtype=bool)
        mask[w.pf_pre.reshape(-1), post] = False
        assert (rows[mask] == 0).all()
    else:
        assert rows.shape == (0, s.purkinje)
    # The accessors are live views of the same segments.
    for name in WF_SEGMENTS:
        assert np.shares_memory(pw.floats(name), pw.wf) or pw.floats(name).size == 0
        np.testing.assert_array_equal(pw.floats(name), f(name))
    for name in WI_SEGMENTS:
        np.testing.assert_array_equal(pw.ints(name), i(name))
    with pytest.raises(KeyError):
        pw.floats("mg_idx")
    with pytest.raises(KeyError):
        pw.ints("pf_w")


def _distinct_parameters(precision: str) -> NetworkParameters:
    """Parameters whose every coefficient is a different non-zero value."""
    dt = torch.float32 if precision == "float32" else torch.float64
    t = lambda x: torch.as_tensor(x, dtype=dt)  # noqa: E731
    lif = [LIFParameters(tau_syn_inv=t(110.0 + 10 * k), tau_mem_inv=t(230.0 + 10 * k), v_leak=t(0.01 * (k + 1)),
                         v_th=t(1.0 + 0.1 * k), v_reset=t(-0.05 * (k + 1)), method="super", alpha=torch.as_tensor(100.0))
           for k in range(3)]
    shape = NetworkShape(mossy=6, granule=16, purkinje=3, dcn=6, classes=3, dendrites=2, pf_per_purkinje=4)
    return NetworkParameters(shape=shape, dt=0.001, steps_per_tick=2, granule=lif[0], purkinje=lif[1], dcn=lif[2],
                             readout=LIParameters(tau_syn_inv=t(170.0), tau_mem_inv=t(90.0), v_leak=t(0.07)),
                             golgi_rate=2.5, golgi_decay=0.97, golgi_base=0.0125, target_sparsity=0.11,
                             readout_scale=3.5, dtype=dt)


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_kernel_coefficients_fill_every_named_slot(precision: str) -> None:
    p = _distinct_parameters(precision)
    coef = kernel_coefficients(p)
    assert coef.shape == (N_COEF,) and coef.dtype == np.dtype(precision)
    expected: dict[int, float] = {}
    for base, pop in ((C_GR, p.granule), (C_PC, p.purkinje), (C_DN, p.dcn)):
        expected |= {base + C_MEM: (p.dt * pop.tau_mem_inv).item(), base + C_SYN: (-p.dt * pop.tau_syn_inv).item(),
                     base + C_LEAK: float(pop.v_leak), base + C_TH: float(pop.v_th), base + C_RESET: float(pop.v_reset)}
    expected |= {C_RO + C_MEM: (p.dt * p.readout.tau_mem_inv).item(), C_RO + C_SYN: (-p.dt * p.readout.tau_syn_inv).item(),
                 C_RO + C_LEAK: float(p.readout.v_leak)}
    expected |= {layout.C_GOLGI_DECAY: p.golgi_decay, layout.C_GOLGI_BASE: p.golgi_base, layout.C_GOLGI_RATE: p.golgi_rate,
                 layout.C_TARGET: p.target_sparsity, layout.C_N_GRANULE: p.shape.granule,
                 layout.C_READOUT_SCALE: p.readout_scale}
    assert sorted(expected) == list(range(N_COEF))
    want = np.array([expected[k] for k in range(N_COEF)], dtype=coef.dtype)
    assert len(set(want.tolist())) == N_COEF and (want != 0).all()  # a misplaced or missing write would show
    np.testing.assert_array_equal(coef, want)


def test_kernel_reads_csr_and_dense_layouts_alike(small_config: Config, ticks: Any, helpers: Any) -> None:
    """Forcing the CSR layout on a network small enough for dense rows gives bit-identical results."""
    stream = ticks(120, markets=5, seed=3)
    dense, csr = CerebellarNetwork(small_config), CerebellarNetwork(small_config)
    backend = csr.backend
    assert backend.packed.dense  # type: ignore[attr-defined]
    backend.packed = PackedWeights.pack(csr.weights, backend.coef.dtype, dense=False)  # type: ignore[attr-defined]
    backend.dims = make_dims(csr.params.shape, csr.pool.arrays.slots, dense=False)  # type: ignore[attr-defined]
    got = [csr.process_batch(stream[k:k + 8]) for k in range(0, len(stream), 8)]
    want = [dense.process_batch(stream[k:k + 8]) for k in range(0, len(stream), 8)]
    assert [helpers.without_time(r) for r in got] == [helpers.without_time(r) for r in want]
    helpers.assert_same_pool(helpers.pool_copy(csr), helpers.pool_copy(dense))
