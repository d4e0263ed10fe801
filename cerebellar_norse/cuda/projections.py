"""The two sparse projections of the network as gathers, for the CUDA backend.

Mossy fibres -> granule cells (``w_mg``, G x M with D inputs per granule cell) and
parallel fibres -> Purkinje cells (``w_pf``, G x P with C inputs per Purkinje cell)
are almost all zeros: for the production network 4,000,000 x 256 parallel-fibre
weights of which 64,000 are synapses. Held dense, the step reads 4 GB of zeros per
network step. Held as (index, value) rows they are read as a gather and a sum:

* ``SparseRows(idx, val)`` is the (R, X) matrix whose row r has the values ``val[r]``
  at the columns ``idx[r]`` (K per row, distinct within a row);
* ``x @ rows.T`` for ``x`` (B, X) is ``(x[:, idx] * val).sum(-1)``, (B, R): the same
  sums as the dense product, term for term, in another order.

:func:`~cerebellar_norse.neurons.functional.cerebellum_step` and the backend's
:func:`~cerebellar_norse.cuda.backend.device_tick` use the weights only as
``mossy @ w.w_mg.T`` and ``z_gr @ w.w_pf``, so ``w_mg = SparseRows(mg_idx, mg_w)`` and
``w_pf = SparseRows(pf_pre, pf_w).T`` take the dense tensors' place unchanged: Python
hands ``tensor @ projection`` to the projection's ``__rmatmul__``.
"""

from __future__ import annotations

import torch


class SparseRows:
    """An (R, X) matrix with ``K`` values per row: ``val`` (R, K) at the columns ``idx`` (R, K) int64.

    Only ``.T`` is used: ``x @ m.T`` (see the module docstring).
    """

    def __init__(self, idx: torch.Tensor, val: torch.Tensor) -> None:
        if idx.shape != val.shape or idx.dim() != 2:
            raise ValueError(f"idx {tuple(idx.shape)} and val {tuple(val.shape)} must be the same (R, K) shape")
        self.idx = idx
        self.val = val

    @property
    def T(self) -> Transposed:  # noqa: N802 (torch's name)
        """The transposed matrix, applied from the right: ``x @ m.T``."""
        return Transposed(self)


class Transposed:
    """``SparseRows.T``: ``x @ t`` is ``(x[:, idx] * val).sum(-1)``, (B, R) for ``x`` (B, X)."""

    def __init__(self, rows: SparseRows) -> None:
        self.rows = rows

    def __rmatmul__(self, x: torch.Tensor) -> torch.Tensor:
        return (x[:, self.rows.idx] * self.rows.val).sum(dim=-1)


__all__ = ["SparseRows", "Transposed"]
