"""The public Python API: CerebellarNetwork.process / process_batch / reset / snapshot / restore."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numba
import numpy as np
import pytest

from cerebellar_norse.config import Config
from cerebellar_norse.errors import CerebellarNorseError, InputError, TickOrderError
from cerebellar_norse.neurons import backends as backends_module
from cerebellar_norse.neurons.network import CerebellarNetwork

ConfigFactory = Any
T0 = 1_640_995_200_000
RESULT_KEYS = {"market_id", "prediction", "probabilities", "confidence", "spike_count", "processing_time_ns", "warming_up"}


def tick(market: str, ts: int, price: float = 100.0, volume: float = 1000.0) -> dict[str, Any]:
    return {"price": price, "volume": volume, "timestamp": ts, "market_id": market}


def market_stream(market: str, n: int, start: int = T0, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    prices = 100.0 * np.exp(np.cumsum(rng.normal(0, 2e-3, n)))
    ts = start + np.cumsum(rng.integers(0, 500, n))
    return [tick(market, int(ts[k]), float(prices[k]), float(rng.lognormal(6, 1))) for k in range(n)]


@pytest.fixture
def net(small_config: Config) -> CerebellarNetwork:
    return CerebellarNetwork(small_config, max_markets=16)


# -- results ---------------------------------------------------------------------


def test_process_returns_the_documented_result(net: CerebellarNetwork, ticks: Any) -> None:
    for t in ticks(60, 3, 1):
        r = net.process(t)
        assert set(r) == RESULT_KEYS
        assert r["market_id"] == t["market_id"]
        p = r["probabilities"]
        assert list(p) == ["down", "flat", "up"]
        assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in p.values())
        assert sum(p.values()) == pytest.approx(1.0, abs=1e-12)
        assert r["prediction"] == pytest.approx(p["up"] - p["down"], abs=1e-15)
        assert -1.0 <= r["prediction"] <= 1.0
        entropy = -sum(v * math.log(v) for v in p.values() if v > 0)
        assert r["confidence"] == pytest.approx(1.0 - entropy / math.log(3.0), abs=1e-9)
        assert 0.0 <= r["confidence"] <= 1.0
        assert isinstance(r["spike_count"], int) and r["spike_count"] >= 0
        assert net.last_spikes.shape == (1, 3)
        assert r["spike_count"] == int(net.last_spikes.sum())
        assert isinstance(r["processing_time_ns"], int) and r["processing_time_ns"] >= 0


def test_markets_do_not_influence_each_other(small_config: Config, helpers: Any) -> None:
    b = market_stream("B", 25, seed=31)
    alone = CerebellarNetwork(small_config, max_markets=4)
    expected = helpers.without_time(alone.process_batch(b))
    mixed = CerebellarNetwork(small_config, max_markets=4)
    a = market_stream("A", 25, seed=32)
    results = mixed.process_batch([t for pair in zip(a, b, strict=True) for t in pair])
    assert helpers.without_time([r for r in results if r["market_id"] == "B"]) == expected


def test_empty_batch(net: CerebellarNetwork) -> None:
    assert net.process_batch([]) == []
    assert net.markets == []


# -- batches ---------------------------------------------------------------------


def test_batch_forms_equal_sequential_processing(small_config: Config, ticks: Any, helpers: Any) -> None:
    stream = ticks(120, 5, 3)
    seq = CerebellarNetwork(small_config, max_markets=8)
    expected = helpers.without_time([seq.process(t) for t in stream])
    as_list = CerebellarNetwork(small_config, max_markets=8, max_batch=32)
    got = [r for start in range(0, len(stream), 40) for r in as_list.process_batch(stream[start:start + 40])]
    assert helpers.without_time(got) == expected
    columns = {k: [t[k] for t in stream] for k in ("price", "volume", "timestamp", "market_id")}
    as_cols = CerebellarNetwork(small_config, max_markets=8)
    assert helpers.without_time(as_cols.process_batch(columns)) == expected
    as_arrays = CerebellarNetwork(small_config, max_markets=8)
    arrays = {"price": np.array(columns["price"]), "volume": np.array(columns["volume"]),
              "timestamp": np.array(columns["timestamp"], dtype=np.int64), "market_id": columns["market_id"]}
    assert helpers.without_time(as_arrays.process_batch(arrays)) == expected
    for other in (as_list, as_cols, as_arrays):
        helpers.assert_same_pool(helpers.pool_copy(other), helpers.pool_copy(seq))


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_ticks_of_one_market_in_one_batch_apply_in_order(tiny_config: Config, backend: str, helpers: Any) -> None:
    a, b = market_stream("A", 6, seed=1), market_stream("B", 3, seed=2)
    batch = [a[0], a[1], b[0], a[2], a[3], b[1], a[4], b[2], a[5]]
    seq = CerebellarNetwork(tiny_config, backend=backend, max_markets=4)
    expected = helpers.without_time([seq.process(t) for t in batch])
    one = CerebellarNetwork(tiny_config, backend=backend, max_markets=4)
    got = helpers.without_time(one.process_batch(batch))
    np.testing.assert_array_equal(one.last_spikes.sum(axis=1), [r["spike_count"] for r in expected])
    if backend == "fused":
        assert got == expected
        helpers.assert_same_pool(helpers.pool_copy(one), helpers.pool_copy(seq))
    else:  # torch's BLAS may sum a batch's matrix product in another order than a single row's: last-bit differences
        for g, e in zip(got, expected, strict=True):
            assert g["spike_count"] == e["spike_count"] and g["market_id"] == e["market_id"]
            np.testing.assert_allclose(list(g["probabilities"].values()), list(e["probabilities"].values()), rtol=0, atol=1e-12)
        np.testing.assert_allclose(helpers.pool_copy(one)[0], helpers.pool_copy(seq)[0], rtol=0, atol=1e-12)
    # a batch bigger than max_batch is split, order still kept
    split = CerebellarNetwork(tiny_config, backend=backend, max_markets=4, max_batch=2)
    assert helpers.without_time(split.process_batch(batch)) == expected
    assert split.last_spikes.shape == (len(batch), 3)


# -- bad input changes nothing ---------------------------------------------------


def _warm(net: CerebellarNetwork) -> None:
    net.process_batch(market_stream("A", 20, seed=3) + market_stream("B", 20, seed=4))


def test_older_tick_raises_tick_order_error_and_changes_nothing(net: CerebellarNetwork, helpers: Any) -> None:
    _warm(net)
    last = int(net.snapshot("A")["enc"][1])
    before = helpers.pool_copy(net)
    with pytest.raises(TickOrderError) as exc:
        net.process(tick("A", last - 1))
    assert isinstance(exc.value, InputError)
    assert exc.value.field == "timestamp"
    helpers.assert_same_pool(helpers.pool_copy(net), before)
    # in a batch: the offending index is named, and the valid ticks before it are not applied
    with pytest.raises(TickOrderError) as exc:
        net.process_batch([tick("C", T0), tick("B", T0 + 10**7), tick("A", last - 1)])
    assert exc.value.field == "ticks.2.timestamp"
    with pytest.raises(TickOrderError) as exc:
        net.process_batch([tick("D", T0 + 5), tick("D", T0 + 4)])
    assert exc.value.field == "ticks.1.timestamp"
    helpers.assert_same_pool(helpers.pool_copy(net), before)
    assert "C" not in net.markets and "D" not in net.markets
    # a tick at the same time as the last one is in order
    net.process(tick("A", last))


BAD_FIELDS = {
    "price": [-1.0, 0.0, float("nan"), float("inf"), "100", True, None],
    "volume": [-0.5, float("nan"), float("-inf"), "1"],
    "timestamp": [1_640_995_200, 1_640_995_200_000_000, 1.5e12 + 0.5, "1640995200000", None],
    "market_id": ["", " A", "x" * 65, 7, "caf\u00e9"],
}


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, vals in BAD_FIELDS.items() for v in vals])
def test_bad_tick_in_a_batch_names_it_and_changes_nothing(net: CerebellarNetwork, helpers: Any, field: str, value: Any) -> None:
    _warm(net)
    before = helpers.pool_copy(net)
    spikes_before = net.last_spikes.copy()
    batch = [tick("A", T0 + 10**7), tick("B", T0 + 10**7), tick("NEW", T0), tick("A", T0 + 10**7 + 1), tick("B", T0 + 10**7 + 5)]
    batch[3] = {**batch[3], field: value}
    with pytest.raises(InputError) as exc:
        net.process_batch(batch)
    assert exc.value.field == f"ticks.3.{field}"
    columns = {k: [t[k] for t in batch] for k in batch[0]}
    with pytest.raises(InputError) as exc:
        net.process_batch(columns)
    assert exc.value.field == f"ticks.3.{field}"
    helpers.assert_same_pool(helpers.pool_copy(net), before)
    np.testing.assert_array_equal(net.last_spikes, spikes_before)
    assert "NEW" not in net.markets


@pytest.mark.parametrize(("change", "field"), [({"extra": 1}, "ticks.3.extra"), ({"volume": None}, "ticks.3.volume")])
def test_missing_or_unknown_field_is_named(net: CerebellarNetwork, helpers: Any, change: dict[str, Any], field: str) -> None:
    _warm(net)
    before = helpers.pool_copy(net)
    batch = [tick("A", T0 + 10**7 + k) for k in range(5)]
    row = {**batch[3], **change}
    batch[3] = {k: v for k, v in row.items() if v is not None}
    with pytest.raises(InputError) as exc:
        net.process_batch(batch)
    assert exc.value.field == field
    helpers.assert_same_pool(helpers.pool_copy(net), before)


def test_batch_with_more_markets_than_slots_is_refused(small_config: Config, helpers: Any) -> None:
    net = CerebellarNetwork(small_config, max_markets=3)
    net.process(tick("A", T0))
    before = helpers.pool_copy(net)
    with pytest.raises(InputError):
        net.process_batch([tick(m, T0) for m in "WXYZ"])
    helpers.assert_same_pool(helpers.pool_copy(net), before)


# -- reset, snapshot, restore ----------------------------------------------------


def test_reset_makes_the_next_tick_a_first_tick(small_config: Config, helpers: Any) -> None:
    net = CerebellarNetwork(small_config, max_markets=4)
    net.process_batch(market_stream("A", 30, seed=5) + market_stream("B", 10, seed=6))
    b_before = net.snapshot("B")
    assert net.reset("A") is True
    assert "A" not in net.markets
    with pytest.raises(InputError):
        net.snapshot("A")
    assert net.reset("A") is False
    assert net.reset("never-seen") is False
    t = tick("A", T0 - 10**6, 55.0, 3.0)  # older than A's history: fine after a reset
    fresh = CerebellarNetwork(small_config, max_markets=4)
    assert helpers.without_time([net.process(t)]) == helpers.without_time([fresh.process(t)])
    for k, v in fresh.snapshot("A").items():
        np.testing.assert_array_equal(net.snapshot("A")[k], v, err_msg=k)
    for k, v in b_before.items():  # other markets untouched
        np.testing.assert_array_equal(net.snapshot("B")[k], v, err_msg=k)


def test_snapshot_restore_round_trip(small_config: Config, helpers: Any) -> None:
    history, future = market_stream("A", 40, seed=7), market_stream("A", 30, start=T0 + 10**8, seed=8)
    src = CerebellarNetwork(small_config, max_markets=4)
    src.process_batch(history)
    snap = src.snapshot("A")
    assert set(snap) == {"enc", "v_gr", "i_gr", "golgi", "v_pc", "i_pc", "v_dcn", "i_dcn", "v_out", "i_out"}
    snap_copy = {k: v.copy() for k, v in snap.items()}
    snap["v_gr"][:] = 123.0  # a snapshot is a copy: changing it changes no market
    assert not np.any(src.snapshot("A")["v_gr"] == 123.0)

    dst = CerebellarNetwork(small_config, max_markets=4)
    dst.restore("A", snap_copy)
    for k, v in snap_copy.items():
        np.testing.assert_array_equal(dst.snapshot("A")[k], v, err_msg=k)
    src.restore("COPY", snap_copy)  # the same state under another market id
    expected = helpers.without_time(src.process_batch(future))
    assert helpers.without_time(dst.process_batch(future)) == expected
    renamed = [{**t, "market_id": "COPY"} for t in future]
    assert [r["probabilities"] for r in src.process_batch(renamed)] == [r["probabilities"] for r in expected]
    # a restored market remembers its last tick time: older ticks are refused
    with pytest.raises(TickOrderError):
        dst.process(tick("A", T0))


def test_restore_with_wrong_shapes_changes_nothing(net: CerebellarNetwork, helpers: Any) -> None:
    _warm(net)
    good = net.snapshot("A")
    before = helpers.pool_copy(net)
    bad_cases = [
        {**good, "v_gr": good["v_gr"][:-1]},
        {**good, "enc": np.zeros(5)},
        {**good, "golgi": np.zeros(2)},
        {k: v for k, v in good.items() if k != "i_out"},
        {},
    ]
    for bad in bad_cases:
        for market in ("A", "NEW"):
            with pytest.raises(InputError) as exc:
                net.restore(market, bad)
            assert exc.value.field == "snapshot"
            helpers.assert_same_pool(helpers.pool_copy(net), before)
    assert "NEW" not in net.markets
    other = CerebellarNetwork(max_markets=2)  # the default network: other shapes
    other.process(tick("A", T0))
    with pytest.raises(InputError):
        net.restore("A", other.snapshot("A"))
    helpers.assert_same_pool(helpers.pool_copy(net), before)


# -- markets and eviction --------------------------------------------------------


def test_lru_eviction_restarts_the_evicted_market_from_rest(small_config: Config, helpers: Any) -> None:
    net = CerebellarNetwork(small_config, max_markets=2)
    a = market_stream("A", 10, seed=9)
    net.process_batch(a)
    net.process_batch(market_stream("B", 10, seed=10))
    assert net.markets == ["A", "B"]
    net.process(a[-1] | {"timestamp": a[-1]["timestamp"] + 1})  # A becomes the most recent
    assert net.markets == ["B", "A"]
    net.process(tick("C", T0))  # evicts B, the least recently used
    assert net.markets == ["A", "C"]
    assert net.pool.table.evictions == 1 and net.pool.table.last_evicted == "B"
    t = tick("B", T0 - 5, 10.0, 1.0)  # older than B's old history: B starts over
    fresh = CerebellarNetwork(small_config, max_markets=2)
    assert helpers.without_time([net.process(t)]) == helpers.without_time([fresh.process(t)])
    for k, v in fresh.snapshot("B").items():
        np.testing.assert_array_equal(net.snapshot("B")[k], v, err_msg=k)
    assert net.markets == ["C", "B"]


def test_markets_lists_live_markets_least_recent_first(net: CerebellarNetwork) -> None:
    net.process_batch([tick("X", T0), tick("Y", T0), tick("Z", T0), tick("X", T0 + 1)])
    assert net.markets == ["Y", "Z", "X"]


# -- construction and determinism ------------------------------------------------


def test_construction_from_none_path_and_config(tmp_path: Path, small_config: Config) -> None:
    default = CerebellarNetwork()
    assert default.params.shape.granule == 512 and default.backend.name == "fused"
    path = tmp_path / "net.toml"
    path.write_text("[neural]\ngranule_size = 64\nconnections_per_neuron = 16\npurkinje_size = 4\n"
                    "target_sparsity = 0.1\n", encoding="utf-8")
    from_path = CerebellarNetwork(path)
    assert from_path.params.shape.granule == 64
    assert CerebellarNetwork(str(path)).params.shape.purkinje == 4
    ref = CerebellarNetwork(small_config, backend="reference", max_markets=2)
    assert ref.backend.name == "reference"
    with pytest.raises((ValueError, CerebellarNorseError)):
        CerebellarNetwork(small_config, backend="gpu-magic")
    with pytest.raises(InputError):
        CerebellarNetwork(small_config, weights=default.weights)  # other shapes


def test_same_config_same_outputs_other_seed_other_outputs(make_config: ConfigFactory, ticks: Any, helpers: Any) -> None:
    stream = ticks(300, 4, 12)
    a = helpers.without_time(CerebellarNetwork(make_config()).process_batch(stream))
    b = helpers.without_time(CerebellarNetwork(make_config()).process_batch(stream))
    assert a == b
    c = helpers.without_time(CerebellarNetwork(make_config({"seed": 43})).process_batch(stream))
    assert [r["probabilities"] for r in c] != [r["probabilities"] for r in a]


# -- parallel fused kernel -------------------------------------------------------


@pytest.mark.skipif(getattr(numba.config, "NUMBA_NUM_THREADS", 1) < 2, reason="numba has fewer than 2 threads on this host")
def test_parallel_fused_equals_serial(make_config: ConfigFactory, ticks: Any, helpers: Any,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"parallel": 0}
    real = backends_module.tick_batch_parallel

    def spy(*args: Any) -> Any:
        calls["parallel"] += 1
        return real(*args)

    monkeypatch.setattr(backends_module, "tick_batch_parallel", spy)
    neural = {"precision": "float64"}
    serial = CerebellarNetwork(make_config(neural), max_markets=16)
    parallel = CerebellarNetwork(make_config(neural, {"cpu_threads": 2}), max_markets=16)
    assert parallel.backend.threads == 2  # type: ignore[attr-defined]
    stream = ticks(400, 7, 21)  # 7 markets: batches of 50 repeat every market several times
    seq = CerebellarNetwork(make_config(neural), max_markets=16)
    expected = helpers.without_time([seq.process(t) for t in stream])
    for start in range(0, len(stream), 50):
        chunk = stream[start:start + 50]
        a = helpers.without_time(serial.process_batch(chunk))
        b = helpers.without_time(parallel.process_batch(chunk))
        assert b == a
        assert b == expected[start:start + 50]
        np.testing.assert_array_equal(parallel.last_spikes, serial.last_spikes)
    assert calls["parallel"] == 8
    helpers.assert_same_pool(helpers.pool_copy(parallel), helpers.pool_copy(serial))
    # below the parallel threshold the calling thread runs the batch
    parallel.process_batch([{**t, "market_id": "S" + str(t["market_id"])} for t in ticks(8, 2, 99)])
    assert calls["parallel"] == 8


def test_one_tick_batch_names_the_indexed_field(net: CerebellarNetwork) -> None:
    net.process(tick("A", T0 + 100))
    with pytest.raises(InputError) as bad_value:
        net.process_batch([tick("A", T0 + 200, price=-1.0)])
    assert bad_value.value.field == "ticks.0.price"
    with pytest.raises(TickOrderError) as bad_order:
        net.process_batch([tick("A", T0)])
    assert bad_order.value.field == "ticks.0.timestamp"


@pytest.mark.parametrize(("ticks", "fragment"), [
    (None, "list of ticks or a mapping of columns"),
    ("ABC", "list of ticks or a mapping of columns"),
    (7, "list of ticks or a mapping of columns"),
    ({"price": 100.0, "volume": 1.0, "timestamp": T0, "market_id": "A"}, "one tick goes to process()"),
])
def test_a_batch_of_the_wrong_kind_is_an_input_error(net: CerebellarNetwork, ticks: Any, fragment: str) -> None:
    with pytest.raises(InputError, match=r"one tick goes|list of ticks") as exc:
        net.process_batch(ticks)
    assert fragment in str(exc.value) and exc.value.field.startswith("ticks")
    assert net.markets == []


def test_decimal_numbers_and_a_generator_of_ticks_are_taken(net: CerebellarNetwork, small_config: Config) -> None:
    from decimal import Decimal

    plain = CerebellarNetwork(small_config)
    a = plain.process_batch([tick("A", T0 + k, price=100.0 + k / 4) for k in range(3)])
    b = net.process_batch(
        {**tick("A", T0 + k), "price": Decimal(str(100.0 + k / 4)), "volume": Decimal("1000")} for k in range(3))
    assert [r["prediction"] for r in a] == [r["prediction"] for r in b]


@pytest.mark.parametrize("name", ["cuda", "gpu-magic"])
def test_a_backend_other_than_fused_or_reference_is_a_clear_value_error(small_config: Config, name: str) -> None:
    """README: any name but "fused" and "reference" raises ValueError, and the message says which to choose
    (not an internal cuda_options argument that CerebellarNetwork has no way to pass)."""
    with pytest.raises(ValueError, match="choose 'fused' or 'reference'") as info:
        CerebellarNetwork(small_config, backend=name)
    assert "cuda_options" not in str(info.value)
