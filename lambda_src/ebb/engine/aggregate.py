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


def row_mean(contributions: list[RowUpdate]) -> RowUpdate:
    """Combine updates (in a fixed order, for determinism) into their row-wise mean."""
    names: dict[str, None] = {}
    for c in contributions:
        names.update(dict.fromkeys(c.rows))
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name in names:
        parts = [c.rows[name] for c in contributions if name in c.rows and c.rows[name][0].numel()]
        if not parts:
            continue
        if len(parts) == 1:
            out[name] = parts[0]
            continue
        idx = torch.cat([p[0] for p in parts])
        vals = torch.cat([p[1] for p in parts])
        rows, where = torch.unique(idx, return_inverse=True)
        sums = torch.zeros(rows.numel(), vals.shape[1]).index_add_(0, where, vals)
        counts = torch.bincount(where, minlength=rows.numel()).unsqueeze(1).to(vals.dtype)
        out[name] = (rows, sums.div_(counts))
    return RowUpdate(out)
