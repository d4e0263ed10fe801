"""Argument tables: a numba kernel's arrays handed over as one integer.

numba's dispatcher types and unboxes every array argument on each call, about
150-200 ns per array; for the fused kernel's sixteen arguments that is about 3 µs of
a 9 µs single-tick step. An :class:`ArgTable` holds the arrays (keeping them alive)
and an int64 table of their addresses and shapes. A kernel takes the table's address
and rebuilds each array in place with :func:`view1` / :func:`view2` (no copy), so a
call costs one integer argument (about 0.3 µs in all).

The arrays must be C-contiguous and stay allocated as long as the table is used:
the table keeps a reference to each, and whoever rebinds an array must build a new
table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numba as nb
import numpy as np
from numba.core import types
from numba.extending import intrinsic

from .. import kernelcache  # noqa: F401  (installs the guard: a failed write of numba's cache is no error)

ENTRY = 3  # int64 per array: address, first and second dimension (1 for 1-D)


def _pointer_typing(typingctx: Any, address: Any, like: Any) -> Any:
    """``address`` (int64) as a pointer to elements of ``like``'s type (a number or a number class)."""
    elem = like.dtype if isinstance(like, (types.NumberClass, types.DType)) else like
    sig = types.CPointer(elem)(address, like)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


_pointer: Any = intrinsic(_pointer_typing)


@nb.njit(cache=True, nogil=True, inline="always")
def view1(table, k, like):
    """Array ``k`` of ``table`` as a 1-D C array of ``like``'s element type."""
    return nb.carray(_pointer(table[ENTRY * k], like), (table[ENTRY * k + 1],))


@nb.njit(cache=True, nogil=True, inline="always")
def view2(table, k, like):
    """Array ``k`` of ``table`` as a 2-D C array of ``like``'s element type."""
    return nb.carray(_pointer(table[ENTRY * k], like), (table[ENTRY * k + 1], table[ENTRY * k + 2]))


@nb.njit(cache=True, nogil=True, inline="always")
def rows_of(a, start, rows, cols):
    """``a[start:start + rows * cols].reshape((rows, cols))`` for a C-contiguous 1-D ``a``, without a copy.

    numba's ``reshape`` calls out to a C helper (about 35 ns); a kernel that views a
    dozen segments per call spends half a microsecond there. No bounds check: the
    caller's layout guarantees the segment lies in ``a``. The view does not own or
    keep ``a`` alive: for use inside a kernel only (see :func:`reshaped`).
    """
    return nb.carray(_pointer(a.ctypes.data + start * a.itemsize, a.dtype), (rows, cols))


@nb.njit(cache=True, nogil=True, inline="always")
def reshaped(a, start, rows, cols):
    """``a[start:start + rows * cols].reshape((rows, cols))``: a view that keeps ``a`` alive (for Python callers)."""
    return a[start:start + rows * cols].reshape((rows, cols))


@nb.njit(cache=True, nogil=True, inline="always")
def table_at(address, n):
    """The int64 table of ``n`` arrays at ``address``."""
    return nb.carray(_pointer(address, nb.int64), (ENTRY * n,))


def compiled_entry(kernel: Any, *example: Any) -> Callable[..., Any]:
    """``kernel``'s compiled variant for the argument types of ``example`` (loaded from numba's cache or
    compiled now), as a function that bypasses numba's dispatcher.

    On every call the dispatcher works out each argument's type and looks the variant
    up: about 200 ns for a few integers, twice per batch on the serving path. The
    variant's own entry only converts the arguments (about 40 ns each). Each call must
    pass arguments of the types of ``example`` (Python ``int`` for int64, ``bool``, the
    same numpy scalar type); another type is converted as numba unboxes it (a float to
    an int truncates), not rejected.
    """
    sig = tuple(nb.typeof(a) for a in example)
    entry: Callable[..., Any] = kernel.compile(sig)
    return entry


class ArgTable:
    """The addresses and shapes of ``arrays`` (each C-contiguous, 1-D or 2-D) in one int64 table.

    ``address`` is what a kernel takes; ``arrays[k]`` is entry k. The table and the
    arrays live as long as this object.
    """

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        self.arrays = tuple(arrays)
        self.table = np.zeros(ENTRY * len(self.arrays), dtype=np.int64)
        for k, a in enumerate(self.arrays):
            if not a.flags.c_contiguous or a.ndim not in (1, 2):
                raise ValueError(f"argument {k} must be a C-contiguous 1-D or 2-D array (got {a.ndim}-D, "
                                 f"contiguous={a.flags.c_contiguous})")
            self.table[ENTRY * k] = a.ctypes.data
            self.table[ENTRY * k + 1] = a.shape[0]
            self.table[ENTRY * k + 2] = a.shape[1] if a.ndim == 2 else 1
        self.address = int(self.table.ctypes.data)
        self.size = len(self.arrays)
