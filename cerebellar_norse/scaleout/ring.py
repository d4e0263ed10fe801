"""HAProxy's consistent-hash ring, reproduced exactly: which replica serves a market.

HAProxy routes ``/neural/…`` by ``balance hdr(X-Market-ID)`` with ``hash-type
consistent sdbm avalanche`` (what plain ``hash-type consistent`` means). This module
computes the same assignment, so that ``cerebellar-norse rebalance`` knows where each
market will live before the routing changes (HAProxy 2.6, ``src/lb_chash.c`` and
``src/backend.c``; the keys of later versions are the same with the default
``hash-key id``):

* a server of id ``puid`` (the ``id`` keyword of its ``server`` line) and weight ``w``
  owns ``16 * w`` points of a 32-bit circle, point ``j`` at
  ``full_hash(puid * 4096 + j)`` (Bob Jenkins' integer avalanche, times 3221225473);
* a request's key is the header value up to its first comma, without surrounding
  spaces and tabs (how HAProxy reads a header value), hashed with ``sdbm`` and then
  ``full_hash`` (the avalanche modifier); an empty
  key is not hashed (HAProxy balances such a request round robin);
* the request goes to the server of the nearest point: of the first point at or after
  the key (wrapping around) and the one before it, the closer one; a tie goes to the
  one before;
* only servers that are up and not in maintenance or drain hold points; with one such
  server, it gets everything.

Points of two servers on the same value (a 32-bit collision) are ordered as HAProxy's
tree would order them only by chance; the ring reports such a collision
(:attr:`Ring.collisions`) and the test suite checks the assignment against a real
HAProxy.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping

MASK = 0xFFFFFFFF
BE_WEIGHT_SCALE = 16  # points per unit of weight
SRV_EWGHT_RANGE = 256 * BE_WEIGHT_SCALE  # spacing of the point keys of consecutive server ids


def full_hash(a: int) -> int:
    """HAProxy's ``full_hash``: Bob Jenkins' 32-bit integer avalanche, then times 3221225473 (mod 2^32)."""
    a &= MASK
    a = ((a + 0x7ED55D16) + (a << 12)) & MASK
    a = ((a ^ 0xC761C23C) ^ (a >> 19)) & MASK
    a = ((a + 0x165667B1) + (a << 5)) & MASK
    a = ((a + 0xD3A2646C) ^ (a << 9)) & MASK
    a = ((a + 0xFD7046C5) + (a << 3)) & MASK
    a = ((a ^ 0xB55A4F09) ^ (a >> 16)) & MASK
    return (a * 3221225473) & MASK


def sdbm(data: bytes) -> int:
    """HAProxy's default hash of a key (``hash_sdbm``), 32-bit."""
    h = 0
    for c in data:
        h = (c + (h << 6) + (h << 16) - h) & MASK
    return h


def routing_key(market_id: str) -> str:
    """The part of an ``X-Market-ID`` value HAProxy hashes: up to the first comma, spaces and tabs trimmed."""
    return market_id.split(",", 1)[0].strip(" \t")


class Ring:
    """The consistent-hash ring of a set of servers.

    Args:
        servers: HAProxy server id (``puid``) → weight (1–256), the servers in service.
    """

    def __init__(self, servers: Mapping[int, int]) -> None:
        points: list[tuple[int, int]] = []
        for puid, weight in servers.items():
            if not 1 <= weight <= 256:
                raise ValueError(f"server id {puid}: weight {weight} is outside 1..256")
            points.extend((full_hash(puid * SRV_EWGHT_RANGE + j), puid) for j in range(weight * BE_WEIGHT_SCALE))
        points.sort()
        self.servers = dict(servers)
        self._keys = [k for k, _ in points]
        self._owners = [s for _, s in points]
        self.collisions = sum(1 for a, b in itertools.pairwise(points) if a[0] == b[0] and a[1] != b[1])

    def owner_of_hash(self, h: int) -> int | None:
        """The server id a 32-bit request hash goes to (None without servers)."""
        if not self._keys:
            return None
        if len(self.servers) == 1:
            return next(iter(self.servers))
        i = bisect.bisect_left(self._keys, h)
        nxt = i if i < len(self._keys) else 0
        prv = nxt - 1  # -1 wraps to the last point
        dp = (h - self._keys[prv]) & MASK
        dn = (self._keys[nxt] - h) & MASK
        return self._owners[prv] if dp <= dn else self._owners[nxt]

    def owner(self, market_id: str) -> int | None:
        """The server id HAProxy routes ``market_id`` to; None when it routes the market round robin (empty key)."""
        key = routing_key(market_id)
        if not key:
            return None
        return self.owner_of_hash(full_hash(sdbm(key.encode("latin-1"))))
