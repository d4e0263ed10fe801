"""The objects made while the service starts, taken out of the cyclic garbage collector's reach.

Python's cyclic collector visits every object of the generations it collects; a full collection
(the oldest generation) visits the whole heap. After start-up the service's heap holds some
350,000 tracked objects (the imported libraries, the app, the engine), and a full collection of
them took 160 ms on the development VM, on the event loop's thread, every request waiting. Such a
collection comes whenever enough objects have survived younger collections since the last one,
however rarely garbage in reference cycles is made. :func:`freeze_startup_heap` collects once
and then freezes what is left (``gc.freeze()``): later collections, full ones included, visit only
objects made after it (docs/http.md, "Garbage per request").

The price: an object frozen here that later becomes garbage in a reference cycle is never freed
(reference counting still frees everything else). What is alive at the end of start-up is the
service itself, alive until it stops; a model replaced by a training job is freed by reference
counting.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("cerebellar_norse.server")


def freeze_startup_heap() -> int:
    """Collect, then freeze every object the collector tracks (call once, when start-up is done, before serving);
    returns how many were frozen."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug("start-up heap frozen: %d objects out of the cyclic collector's reach (%.0f ms)", frozen,
              (time.perf_counter() - t0) * 1e3, extra={"fields": {"objects": frozen}})
    return frozen
