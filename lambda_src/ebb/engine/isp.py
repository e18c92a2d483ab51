"""The ISP significance filter (MLLess §4.1, DESIGN §3).

Each worker keeps, per parameter, an accumulator δ of the local updates it has not sent.
After a local step δ += u; parameter i is *significant* when ``|δ_i / x_i| > v_t`` with
``v_t = v / sqrt(t)``; significant entries are sent and their accumulators reset, the
rest keep accumulating. The test is per scalar, as in the paper; a row travels with only
its significant entries (the codec masks the others out). Only the rows the minibatch
touched can change, so only they are scanned. With ``v = 0`` every touched row is sent
whole, which reproduces BSP bit for bit. (NaN, from 0/0, is never significant; δ/0 with
δ ≠ 0 always is.)

With ``quantize`` the significant values travel as int8 codes with a per-row scale
(float16 for narrow rows, see ``ebb.sparse.compress_rows``): about a quarter of the
bytes. What the rounding leaves out is kept in the accumulator (error feedback, as in
1-bit SGD and EF-SGD), so the sent and pending parts still add up to every local update.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ebb.sparse import Packed, RowUpdate, compress_rows


class SignificanceFilter:
    def __init__(self, params: dict[str, torch.Tensor], threshold: float, quantize: bool = False):
        self.threshold, self.quantize = threshold, quantize
        self.pending = {name: torch.zeros_like(p) for name, p in params.items()}

    def threshold_at(self, step: int) -> float:
        """v_t = v / sqrt(t), with steps counted from 1."""
        return self.threshold / math.sqrt(step + 1)

    def __call__(self, update: RowUpdate, params: dict[str, torch.Tensor], step: int) -> RowUpdate:
        """Accumulate ``update`` and return the significant part (sent accumulators reset).

        The result carries the rows the update touched as ``touched``, so readers count
        this worker as a toucher of rows whose change is still pending.
        """
        v_t = self.threshold_at(step)
        sent: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        packed: dict[str, Packed] = {}
        for name, (rows, vals) in update.rows.items():
            acc = self.pending[name]
            acc_rows = acc.index_select(0, rows).add_(vals)
            if v_t > 0:
                x_rows = update.base.get(name) if update.base else None  # the model gathered them already
                if x_rows is None:
                    x_rows = params[name].index_select(0, rows)
                magnitude = acc_rows.abs()
                significant = magnitude > x_rows.abs().mul_(v_t)
                # Work on every touched row and select the sent ones last: nearly every touched
                # row has a significant entry, so selecting first would copy nearly everything
                # twice. A row with nothing significant carries zeros and its δ is unchanged.
                out_vals = acc_rows.mul(significant)
                magnitude.mul_(significant)  # |out_vals|, for the quantiser's row maxima
                any_significant = significant.numpy().any(axis=1)  # numpy: twice torch's speed here
                at = torch.from_numpy(np.flatnonzero(any_significant))  # positions: cheaper to gather by
                partial = at.numel() < rows.numel()
                if partial:  # (a NaN δ, never significant, would otherwise ride along as NaN × 0)
                    idle = torch.from_numpy(~any_significant)
                    out_vals[idle] = 0.0
                    magnitude[idle] = 0.0
                if self.quantize:
                    # Error feedback: what rounding leaves out stays pending and goes later.
                    pack, out_vals = compress_rows(out_vals, magnitude)
                    if partial:
                        pack = (pack[0].index_select(0, at), None if pack[1] is None else pack[1].index_select(0, at))
                    packed[name] = pack
                acc_rows.sub_(out_vals)  # exactly 0 where sent unrounded
                acc.index_copy_(0, rows, acc_rows)
                out_rows = rows.index_select(0, at) if partial else rows
                if partial:
                    out_vals = out_vals.index_select(0, at)
            else:  # BSP's wire: every touched row, whole, even an all-zero one
                out_rows, out_vals = rows, acc_rows
                acc.index_fill_(0, rows, 0.0)
            sent[name] = (out_rows, out_vals)
        return RowUpdate(sent, touched={name: rows for name, (rows, _) in update.rows.items()}, packed=packed or None)

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
