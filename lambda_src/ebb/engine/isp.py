"""The ISP significance filter (MLLess §4.1; docs/ARCHITECTURE.md, "Synchronisation").

Each worker keeps, per parameter, an accumulator δ of the local updates it has not sent.
After a local step δ += u; parameter i is *significant* when ``|δ_i / x_i| > v_t`` with
``v_t = v / sqrt(t)``; significant entries are sent and their accumulators reset, the
rest keep accumulating. The test is per scalar, as in the paper; a row travels with only
its significant entries (the codec masks the others out). Only the rows the minibatch
touched can change, so only they are scanned. With ``v = 0`` every touched row is sent
whole, which reproduces BSP bit for bit. (NaN, from 0/0, is never significant; δ/0 with
δ ≠ 0 always is.)

With ``quantize`` the significant values travel as int8 codes with a per-row scale
(float16 for narrow rows, see ``ebb.sparse.quantize_rows``): about a quarter of the
bytes. What the rounding leaves out is kept in the accumulator (error feedback, as in
1-bit SGD and EF-SGD), so the sent and pending parts still add up to every local update.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ebb import native
from ebb.sparse import Packed, RowUpdate, gather_rows, quantize_rows, quantized_form, row_peaks, scatter_rows


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
        subset: dict[str, np.ndarray] = {}
        for name, (rows, vals) in update.rows.items():
            acc = self.pending[name]
            if v_t > 0:
                x_rows = update.base.get(name) if update.base else None  # the model gathered them already
                if x_rows is None:
                    x_rows = params[name].index_select(0, rows)
                sent[name], pack, subset[name] = self._significant(acc, rows, vals, x_rows, v_t)
                if pack is not None:
                    packed[name] = pack
            else:  # BSP's wire: every touched row, whole, even an all-zero one
                acc_rows = acc.index_select(0, rows).add_(vals)
                acc.index_fill_(0, rows, 0.0)
                sent[name] = (rows, acc_rows)
        return RowUpdate(
            sent,
            touched={name: rows for name, (rows, _) in update.rows.items()},
            packed=packed or None,
            subset=subset or None,
        )

    def _significant(
        self, acc: torch.Tensor, rows: torch.Tensor, vals: torch.Tensor, x_rows: torch.Tensor, v_t: float
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], Packed | None, np.ndarray]:
        """δ[rows] += vals; the sent (rows, values), their packed form and their positions
        among ``rows``; δ keeps the rest.

        In one pass with the compiled kernels (``ebb.native``); else, bit for bit the
        same, in numpy, in as few passes as it takes: each pass over the k × dim rows
        costs about what torch's costs, but numpy's row gather and scatter are 2–4× faster
        than ``index_select``/``index_copy_``, and its float masks cheaper than torch's bools.
        """
        table, at_rows = acc.numpy(), rows.numpy()
        dim = table.shape[1]
        if native.available():
            form = quantized_form(dim) if self.quantize else None
            done = native.isp_filter(table, rows, vals.reshape(-1, dim), x_rows.reshape(-1, dim), np.float32(v_t), form)
            if done is not None:  # (None: a NaN or infinite row, for numpy below)
                at, out_vals, codes, scales = done
                pack: Packed | None = None
                if codes is not None:
                    pack = (
                        torch.from_numpy(codes),
                        None if scales is None else torch.from_numpy(scales.view(np.int16)).view(torch.bfloat16),
                    )
                sent_rows = rows if at.size == at_rows.size else torch.from_numpy(at_rows.take(at))
                return (sent_rows, torch.from_numpy(out_vals)), pack, at
        delta = gather_rows(table, at_rows)
        np.add(delta, vals.numpy().reshape(delta.shape), out=delta)
        magnitude = np.abs(delta)
        # |δ| > v_t |x|, as 1.0 / 0.0 (written over the thresholds): δ × that is what is sent
        # (NaN, from 0/0, compares false: never significant).
        significant = np.abs(x_rows.numpy().reshape(delta.shape))
        np.multiply(significant, np.float32(v_t), out=significant)
        np.greater(magnitude, significant, out=significant)
        out_vals = np.multiply(delta, significant)
        np.multiply(magnitude, significant, out=magnitude)  # |out_vals|, for the quantiser's row maxima
        # A row with a significant entry has a positive maximum, an idle row carries zeros
        # and its δ is unchanged. A NaN maximum (a NaN δ, never significant, times 0) says
        # nothing: those rows ask their entries.
        peak = row_peaks(magnitude)
        live = peak > 0
        unsure = np.flatnonzero(np.isnan(peak))
        if unsure.size:
            live[unsure] = significant[unsure].any(axis=1)
        at = np.flatnonzero(live)
        partial = at.size < at_rows.size
        if partial:  # (a NaN δ would otherwise ride along as NaN × 0, and -0.0 stays -0.0 pending)
            idle = np.flatnonzero(~live)
            out_vals[idle] = 0.0
            peak[idle] = 0.0
        pack = None
        if self.quantize:
            # Error feedback: what rounding leaves out stays pending and goes later.
            pack, out_vals = quantize_rows(out_vals, peak)
            if partial:
                pack = (
                    torch.from_numpy(pack[0].numpy().take(at, axis=0)),
                    None if pack[1] is None else pack[1].index_select(0, torch.from_numpy(at)),
                )
        np.subtract(delta, out_vals, out=delta)  # exactly 0 where sent unrounded
        scatter_rows(table, at_rows, delta)
        if partial:
            return (torch.from_numpy(at_rows.take(at)), torch.from_numpy(out_vals.take(at, axis=0))), pack, at
        return (rows, torch.from_numpy(out_vals)), pack, at

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
