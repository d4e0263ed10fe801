"""Staged steps (the backend's own input buffers, arrays handed to the kernel as one table) equal plain steps."""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np
import pytest

from cerebellar_norse.config import Config
from cerebellar_norse.neurons.native import ArgTable, compiled_entry
from cerebellar_norse.neurons.network import CerebellarNetwork
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.ticks import validate_ticks

ConfigFactory = Any


def _batches(net: CerebellarNetwork, ticks: list[dict[str, Any]], sizes: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Kernel arrays of consecutive batches of ``ticks`` (sizes cycle through ``sizes``)."""
    valid = validate_ticks(ticks)
    out, k, j = [], 0, 0
    while k < len(valid):
        chunk = valid[k:k + sizes[j % len(sizes)]]
        slots = np.array([net.pool.table.acquire(t.market_id) for t in chunk], dtype=np.int64)
        arr = np.array([[t.price for t in chunk], [t.volume for t in chunk], [t.timestamp for t in chunk]])
        out.append((slots, arr))
        k += len(chunk)
        j += 1
    return out


def _staged(net: CerebellarNetwork, slots: np.ndarray, arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    staged_slots, staged_ticks = net.backend.input_buffers()
    b = slots.shape[0]
    staged_slots[:b], staged_ticks[:, :b] = slots, arr
    return net.backend.step_buffered(b)


@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_staged_steps_equal_plain_steps(make_config: ConfigFactory, small_config: Config, ticks: Any,
                                        backend: str, precision: str) -> None:
    cfg = make_config({**small_config.neural.model_dump(include={"mossy_size", "granule_size", "purkinje_size",
                                                                 "connections_per_neuron", "dcn_size"}),
                       "precision": precision})
    plain = CerebellarNetwork(cfg, backend=backend, max_markets=8, max_batch=16)
    staged = CerebellarNetwork(cfg, backend=backend, weights=plain.weights, max_markets=8, max_batch=16)
    stream = ticks(120 if backend == "fused" else 30, markets=5, seed=3)
    # batch sizes 1, 16 (full workspace) and 7 (several ticks of one market in one batch)
    for (slots, arr), (slots2, arr2) in zip(_batches(plain, stream, [1, 16, 7]), _batches(staged, stream, [1, 16, 7]),
                                            strict=True):
        p0, s0 = plain.backend.step(slots, arr)
        p1, s1 = _staged(staged, slots2, arr2)
        np.testing.assert_array_equal(p0, p1)
        np.testing.assert_array_equal(s0, s1)
        out_p, out_s = staged.backend.output_buffers()  # the results are the first rows of the output buffers
        np.testing.assert_array_equal(out_p[:len(slots)], p0)
        np.testing.assert_array_equal(out_s[:len(slots)], s0)
        assert np.shares_memory(p1, out_p) and np.shares_memory(s1, out_s)
    np.testing.assert_array_equal(plain.pool.arrays.flat, staged.pool.arrays.flat)
    np.testing.assert_array_equal(plain.pool.arrays.enc, staged.pool.arrays.enc)


def test_staged_steps_use_swapped_weights(small_config: Config, ticks: Any) -> None:
    plain = CerebellarNetwork(small_config, max_markets=8, max_batch=4)
    staged = CerebellarNetwork(small_config, weights=plain.weights, max_markets=8, max_batch=4)
    other = generate_weights(small_config.model_copy(update={"neural": small_config.neural.model_copy(update={"seed": 7})}))
    stream = ticks(40, markets=3, seed=5)
    changed = False
    for k, ((slots, arr), (slots2, arr2)) in enumerate(zip(_batches(plain, stream, [4]), _batches(staged, stream, [4]),
                                                           strict=True)):
        if k == 3:
            plain.backend.set_weights(other)
            staged.backend.set_weights(other)
        p0, _ = plain.backend.step(slots, arr)
        p1, _ = _staged(staged, slots2, arr2)
        np.testing.assert_array_equal(p0, p1)
        changed = changed or k >= 3
    assert changed
    np.testing.assert_array_equal(plain.pool.arrays.flat, staged.pool.arrays.flat)


def test_staged_step_refuses_a_batch_beyond_its_buffers(small_config: Config) -> None:
    net = CerebellarNetwork(small_config, max_markets=4, max_batch=4)
    before = net.pool.arrays.flat.copy()
    with pytest.raises(ValueError, match="batch of 5 is outside the workspace of 4"):
        net.backend.step_buffered(5)
    with pytest.raises(ValueError, match="batch of -1"):
        net.backend.step_buffered(-1)
    np.testing.assert_array_equal(net.pool.arrays.flat, before)


def test_arg_table_holds_addresses_and_shapes() -> None:
    a = np.arange(6, dtype=np.float32)
    b = np.zeros((2, 3), dtype=np.int64)
    t = ArgTable([a, b])
    assert t.size == 2 and t.arrays[0] is a
    assert t.table.tolist() == [a.ctypes.data, 6, 1, b.ctypes.data, 2, 3]
    assert t.address == t.table.ctypes.data


@pytest.mark.parametrize("bad", [np.zeros((4, 4))[:, :2], np.zeros((2, 2, 2)), np.zeros(8)[::2]])
def test_arg_table_refuses_arrays_a_kernel_cannot_view(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="argument 1 must be a C-contiguous 1-D or 2-D array"):
        ArgTable([np.zeros(3), bad])


@nb.njit(cache=False)
def _scaled_sum(a, b, scale):
    return (a + b) * scale


def test_compiled_entry_is_the_variant_of_the_example_types() -> None:
    as_ints = compiled_entry(_scaled_sum, 1, 2, 3)
    as_f32 = compiled_entry(_scaled_sum, 1, 2, np.float32(0.5))
    assert as_ints is _scaled_sum.overloads[(nb.int64, nb.int64, nb.int64)].entry_point
    assert as_f32 is _scaled_sum.overloads[(nb.int64, nb.int64, nb.float32)].entry_point
    assert as_ints(4, 5, 2) == _scaled_sum(4, 5, 2) == 18
    assert as_f32(1, 2, np.float32(0.1)) == _scaled_sum(1, 2, np.float32(0.1))
    # the float32 variant rounds the scale to float32: not the float64 answer
    assert as_f32(1, 2, np.float32(0.1)) != (1 + 2) * 0.1
    assert compiled_entry(_scaled_sum, 7, 8, 9) is as_ints  # resolved once, then found
