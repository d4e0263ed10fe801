"""Market state pool: preallocated slot arrays and a least-recently-used slot table.

All market states live in one :class:`~cerebellar_norse.neurons.state.StateArrays`
of ``capacity`` slots, allocated once. A market gets a slot on its first tick; when
every slot is taken, the least recently used market is evicted (its slot reset, so
if it comes back it restarts from the initial state) and the eviction is counted.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from ..neurons.encoder import S_LAST_TS, S_N_TICKS
from ..neurons.state import StateArrays

# SlotTable.bookkeeping(): market -> slot in LRU order, free slots, last-use times (time.monotonic(), s), evictions,
# the last market evicted
Bookkeeping = tuple[OrderedDict[str, int], list[int], dict[str, float], int, str | None]


class SlotTable:
    """Maps market ids to slots with LRU eviction. Not thread-safe: one owner at a time.

    Args:
        capacity: number of slots.
        on_new_slot: called with the slot index whenever a slot is (re)assigned, to reset it.
    """

    def __init__(self, capacity: int, on_new_slot: Callable[[int], None]) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._on_new_slot = on_new_slot
        self._slots: OrderedDict[str, int] = OrderedDict()
        self._free = list(range(capacity - 1, -1, -1))
        self._last_used: dict[str, float] = {}
        self.evictions = 0
        self.last_evicted: str | None = None
        self.on_release: Callable[[str], None] | None = None  # told of every released market (the journal)

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, market_id: object) -> bool:
        return market_id in self._slots

    def markets(self) -> list[str]:
        """Markets holding a slot, least recently used first."""
        return list(self._slots)

    def get(self, market_id: str) -> int | None:
        """The slot of a market without touching its recency, or None."""
        return self._slots.get(market_id)

    def acquire(self, market_id: str) -> int:
        """The market's slot (assigning one, evicting the LRU market if full); marks it most recent."""
        slot = self._slots.get(market_id)
        self._last_used[market_id] = time.monotonic()
        if slot is not None:
            self._slots.move_to_end(market_id)
            return slot
        if self._free:
            slot = self._free.pop()
        else:
            victim, slot = self._slots.popitem(last=False)
            self._last_used.pop(victim, None)
            self.evictions += 1
            self.last_evicted = victim
        self._on_new_slot(slot)
        self._slots[market_id] = slot
        return slot

    def spare(self) -> int | None:
        """A slot no market holds (the free one :meth:`acquire` hands out last), or None when every slot is taken.

        Whatever is written to it is discarded: a slot is reset whenever a market is given it.
        """
        return self._free[0] if self._free else None

    def evict_idle(self, keep: int, idle_s: float, now: float | None = None) -> list[str]:
        """Evict least recently used markets idle for more than ``idle_s`` until at most ``keep`` remain."""
        now = time.monotonic() if now is None else now
        gone: list[str] = []
        while len(self._slots) > keep:
            market = next(iter(self._slots))
            if now - self._last_used.get(market, now) <= idle_s:
                break
            self.release(market)
            self.evictions += 1
            self.last_evicted = market
            gone.append(market)
        return gone

    def release(self, market_id: str) -> bool:
        """Forget a market and free its slot; True when it held one."""
        slot = self._slots.pop(market_id, None)
        self._last_used.pop(market_id, None)
        if slot is None:
            return False
        self._free.append(slot)
        if self.on_release is not None:
            self.on_release(market_id)
        return True

    def items(self) -> list[tuple[str, int]]:
        """(market, slot) pairs, least recently used first."""
        return list(self._slots.items())

    def bookkeeping(self) -> Bookkeeping:
        """A copy of which market holds which slot, in LRU order, with the free slots and counters (for :meth:`put_back`)."""
        return OrderedDict(self._slots), list(self._free), dict(self._last_used), self.evictions, self.last_evicted

    def put_back(self, saved: Bookkeeping) -> None:
        """Undo every acquire and eviction since :meth:`bookkeeping` (slots are not reset: restore their states too).

        Nothing is told to ``on_release``: the markets are as they were, not released.
        """
        slots, free, last_used, evictions, last_evicted = saved
        self._slots, self._free, self._last_used = OrderedDict(slots), list(free), dict(last_used)
        self.evictions, self.last_evicted = evictions, last_evicted


class StatePool:
    """Slot arrays plus the slot table: the state of every live market."""

    def __init__(self, arrays: StateArrays, reset_slot: Callable[[int], None]) -> None:
        self.arrays = arrays
        self.table = SlotTable(arrays.slots, reset_slot)

    @property
    def capacity(self) -> int:
        """Number of slots."""
        return self.table.capacity

    def last_timestamp(self, market_id: str) -> int | None:
        """Time (ms) of the last tick applied to a market with live state, else None."""
        slot = self.table.get(market_id)
        if slot is None or self.arrays.enc[slot, S_N_TICKS] == 0:
            return None
        return int(self.arrays.enc[slot, S_LAST_TS])

    @property
    def used(self) -> int:
        """Slots holding a market."""
        return len(self.table)
