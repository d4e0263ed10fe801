"""SlotTable (market -> slot with LRU eviction) and StatePool."""

from __future__ import annotations

import pytest

from cerebellar_norse.config import load_config
from cerebellar_norse.engine.pool import SlotTable, StatePool
from cerebellar_norse.neurons.parameters import network_parameters
from cerebellar_norse.neurons.state import StateArrays


class Recorder:
    """on_new_slot callback that remembers every (re)assigned slot."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, slot: int) -> None:
        self.calls.append(slot)


def test_acquire_assigns_distinct_slots_and_resets_each_once() -> None:
    reset = Recorder()
    table = SlotTable(3, reset)
    assert [table.acquire(m) for m in "ABC"] == [0, 1, 2]
    assert reset.calls == [0, 1, 2]
    assert table.acquire("B") == 1 and reset.calls == [0, 1, 2]  # known market: same slot, no reset
    assert len(table) == 3 and "A" in table and "Z" not in table
    assert table.evictions == 0 and table.last_evicted is None


def test_acquire_marks_most_recent_and_get_does_not() -> None:
    table = SlotTable(3, Recorder())
    for m in "ABC":
        table.acquire(m)
    table.acquire("A")
    assert table.markets() == ["B", "C", "A"]
    assert table.get("B") == 1 and table.get("nope") is None
    assert table.markets() == ["B", "C", "A"]  # get leaves recency alone
    assert table.items() == [("B", 1), ("C", 2), ("A", 0)]


def test_full_table_evicts_the_least_recently_used() -> None:
    reset = Recorder()
    table = SlotTable(3, reset)
    for m in "ABC":
        table.acquire(m)
    table.acquire("A")  # B is now least recently used
    slot = table.acquire("D")
    assert slot == 1 and "B" not in table
    assert table.evictions == 1 and table.last_evicted == "B"
    assert reset.calls[-1] == 1  # the victim's slot is reset for the newcomer
    table.acquire("E")
    assert table.last_evicted == "C" and table.evictions == 2
    assert table.markets() == ["A", "D", "E"]
    assert table.acquire("B") == 0 and table.last_evicted == "A"  # an evicted market comes back as a new one


def test_release_frees_the_slot_without_counting_an_eviction() -> None:
    reset = Recorder()
    table = SlotTable(2, reset)
    table.acquire("A")
    table.acquire("B")
    assert table.release("A") is True
    assert table.release("A") is False and table.release("never") is False
    assert len(table) == 1 and "A" not in table
    assert table.acquire("C") == 0  # the freed slot, no eviction needed
    assert table.evictions == 0 and table.markets() == ["B", "C"]
    assert reset.calls == [0, 1, 0]


def test_capacity_one() -> None:
    reset = Recorder()
    table = SlotTable(1, reset)
    assert table.acquire("A") == 0
    assert table.acquire("A") == 0 and table.evictions == 0
    for k, m in enumerate("BCD", start=1):
        assert table.acquire(m) == 0
        assert table.evictions == k and table.markets() == [m]
    assert table.last_evicted == "C"
    assert reset.calls == [0, 0, 0, 0]


@pytest.mark.parametrize("capacity", [0, -1])
def test_capacity_must_be_positive(capacity: int) -> None:
    with pytest.raises(ValueError, match="capacity"):
        SlotTable(capacity, Recorder())


def test_many_markets_keep_lru_order() -> None:
    table = SlotTable(8, Recorder())
    touched: list[str] = []
    for k in range(100):
        m = f"M{(k * 7) % 13}"
        table.acquire(m)
        if m in touched:
            touched.remove(m)
        touched.append(m)
    assert table.markets() == touched[-8:]
    assert sorted(s for _, s in table.items()) == list(range(8))
    assert table.evictions == 100 - 8  # a cycle of 13 markets over 8 slots misses on every tick after the first 8


def test_state_pool_resets_reassigned_slots() -> None:
    cfg = load_config(None, environ={})
    params = network_parameters(cfg)
    arrays = StateArrays.allocate(2, params, cfg.neural.precision)
    pool = StatePool(arrays, lambda s: arrays.reset_slot(s, params, 0.25))
    assert pool.capacity == 2 and pool.used == 0
    slot = pool.table.acquire("A")
    arrays.v_gr[slot] = 0.5
    arrays.enc[slot] = 3.0
    pool.table.acquire("B")
    pool.table.acquire("C")  # evicts A, whose slot is reset for C
    assert pool.used == 2 and pool.table.get("C") == slot
    assert (arrays.v_gr[slot] == float(params.granule.v_leak)).all()
    assert (arrays.enc[slot] == 0.0).all() and arrays.golgi[slot] == 0.25
