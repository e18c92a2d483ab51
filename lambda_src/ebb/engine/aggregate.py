"""How the updates of one step combine: the row-wise mean over the workers that sent a row.

MLLess averages the workers' gradients. Averaging over *all* P workers would shrink the
step of a row only one worker touched by P; summing would multiply the step of a row
every worker touched (a popular item, the bias) by P. The row-wise mean over the
contributors does neither: each row moves by the average of the steps proposed for it,
which is what one worker with the whole global batch would do under the per-row-mean
gradients of the models. With one worker it is the identity.
"""

from __future__ import annotations

import torch

from ebb.sparse import RowUpdate


TOUCHED = "~"  # prefix of the entries that carry only the rows a worker touched


def touched_rows(update: RowUpdate) -> RowUpdate:
    """The rows an update touched, as value-less entries (indices only) to ship beside it."""
    return RowUpdate({TOUCHED + name: (rows, torch.zeros(rows.numel(), 0)) for name, (rows, _) in update.rows.items()})


def split_touched(update: RowUpdate) -> tuple[RowUpdate, dict[str, torch.Tensor]]:
    """Separate a received payload into its values and the rows its sender touched."""
    values = {n: e for n, e in update.rows.items() if not n.startswith(TOUCHED)}
    touched = {n[len(TOUCHED):]: e[0] for n, e in update.rows.items() if n.startswith(TOUCHED)}
    return RowUpdate(values), touched


def row_mean(contributions: list[RowUpdate], touched: list[dict[str, torch.Tensor]] | None = None) -> RowUpdate:
    """Combine updates (in a fixed order, for determinism) into their row-wise mean.

    The divisor of a row is the number of contributions carrying it, or, when
    ``touched`` is given (ISP: a worker may touch a row yet send nothing for it yet),
    the number of workers that touched it this step, as BSP would count them.
    """
    names: dict[str, None] = {}
    for c in contributions:
        names.update(dict.fromkeys(c.rows))
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name in names:
        parts = [c.rows[name] for c in contributions if name in c.rows and c.rows[name][0].numel()]
        if not parts:
            continue
        if len(parts) == 1 and touched is None:
            out[name] = parts[0]
            continue
        idx = torch.cat([p[0] for p in parts])
        vals = torch.cat([p[1] for p in parts])
        rows, where = torch.unique(idx, return_inverse=True)
        sums = torch.zeros(rows.numel(), vals.shape[1]).index_add_(0, where, vals)
        if touched is None:
            counts = torch.bincount(where, minlength=rows.numel())
        else:
            all_touched = torch.cat([t[name] for t in touched if name in t] + [rows[:0]])
            size = max(int(rows.max()), int(all_touched.max()) if all_touched.numel() else 0) + 1
            # A row sent late (its accumulator crossed the threshold) may be touched by no one now.
            counts = torch.bincount(all_touched, minlength=size)[rows].clamp_(min=1)
        counts = counts.unsqueeze(1).to(vals.dtype)
        out[name] = (rows, sums.div_(counts))
    return RowUpdate(out)
