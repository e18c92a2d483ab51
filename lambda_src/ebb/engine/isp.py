"""The ISP significance filter (MLLess §4.1, DESIGN §3).

Each worker keeps, per parameter, an accumulator δ of the local updates it has not sent.
After a local step δ += u; a row is *significant* when ``|δ_row| / |x_row| > v_t`` with
``v_t = v / sqrt(t)``; significant rows are sent and their accumulators reset, the rest
keep accumulating. For a weight vector (rows of width 1) this is exactly the scalar
per-parameter test of the paper; for an embedding row it is its L2 generalisation, so a
row travels whole and the wire stays row-sparse. Only the rows the minibatch touched
can change, so only they are scanned. With ``v = 0`` every non-zero row is sent, which
reproduces BSP bit for bit. (NaN, from 0/0, is never significant; x/0 always is.)
"""

from __future__ import annotations

import math

import torch

from ebb.sparse import RowUpdate


class SignificanceFilter:
    def __init__(self, params: dict[str, torch.Tensor], threshold: float):
        self.threshold = threshold
        self.pending = {name: torch.zeros_like(p) for name, p in params.items()}

    def threshold_at(self, step: int) -> float:
        """v_t = v / sqrt(t), with steps counted from 1."""
        return self.threshold / math.sqrt(step + 1)

    def __call__(self, update: RowUpdate, params: dict[str, torch.Tensor], step: int) -> RowUpdate:
        """Accumulate ``update`` and return the significant part (accumulators of sent rows reset)."""
        v_t = self.threshold_at(step)
        sent: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, (rows, vals) in update.rows.items():
            acc = self.pending[name]
            acc_rows = acc[rows].add_(vals)
            ratio = acc_rows.norm(dim=1) / params[name][rows].norm(dim=1)
            # v = 0 sends every touched row, exactly as BSP does (even an all-zero one).
            significant = ratio > v_t if v_t > 0 else torch.ones_like(ratio, dtype=torch.bool)
            acc[rows] = acc_rows.masked_fill(significant.unsqueeze(1), 0.0)
            sent[name] = (rows[significant], acc_rows[significant])
        return RowUpdate(sent)

    def pending_nnz(self) -> int:
        return sum(int((p != 0).sum()) for p in self.pending.values())

    def flush(self) -> RowUpdate:
        """Everything still pending, as one update (and the accumulators cleared)."""
        out = {}
        for name, acc in self.pending.items():
            rows = (acc != 0).any(dim=1).nonzero().flatten()
            out[name] = (rows, acc[rows].clone())
            acc.zero_()
        return RowUpdate(out)
