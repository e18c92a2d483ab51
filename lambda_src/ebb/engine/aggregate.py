"""How the updates of one step combine: the row-wise mean over the workers that touched a row.

MLLess averages the workers' gradients. Averaging over *all* P workers would shrink the
step of a row only one worker touched by P; summing would multiply the step of a row
every worker touched (a popular item, the bias) by P. The row-wise mean over the
workers that touched the row does neither: each row moves by the average of the steps
proposed for it, which is what one worker with the whole global batch would do under
the per-row-mean gradients of the models. With one worker it is the identity.

Under ISP a worker may touch a row yet send nothing for it yet (its change is still
pending); it still counts as a toucher, exactly as under BSP, so a filtered row is not
inflated by a smaller divisor. A row sent late (its accumulator crossed the threshold
in a step where nobody touched it) is divided by 1.

``combine="sum"`` (``sync.combine``) adds every contribution undivided instead: the
workers' proposals land as if taken one after another. It suits an optimiser whose
proposal is a normalised step (Adam: about lr per entry whatever the gradient), where
the mean of P proposals is one worker's step on the rows every worker touches but a
full step on a row only one touched (each model's choice is in ``ebb.catalogue``). The
sum is capped (``sum_cap``, ``sync.sum_cap``): a row more than ``sum_cap`` workers touched
in a step moves by ``sum_cap`` times their mean, since a feature every worker of a large
fleet sees would otherwise take P Adam steps at once and not converge; at or below
``sum_cap`` workers nothing changes (docs/ARCHITECTURE.md, "Validation and early
stopping"; docs/RESULTS.md has the runs behind the default).
"""

from __future__ import annotations

import torch

from ebb import native
from ebb.sparse import ELEMENT_COST, RowUpdate


class RowMean:
    """Adds the row-wise mean of a step's updates into a replica.

    Each contribution is divided row by row by its toucher count and added straight into
    the parameters: the cost of a step is linear in what was received, with no sort or
    unique over the concatenated updates, which matters when every worker reads every
    peer's update every step. Contributions are added in the order given, so replicas
    that receive the same updates in the same order stay bit-identical.
    """

    def __init__(self, params: dict[str, torch.Tensor], combine: str = "mean", sum_cap: int | None = None):
        if combine not in ("mean", "sum"):
            raise ValueError(f"combine must be 'mean' or 'sum', not {combine!r}")
        if sum_cap is not None and sum_cap < 1:
            raise ValueError(f"sum_cap must be at least 1, not {sum_cap}")
        # Each contribution is divided by max(1, touchers / per): the mean divides by
        # every toucher, the capped sum only past `sum_cap` of them.
        self.per = 1.0 if combine == "mean" else float(sum_cap) if sum_cap else None
        self.counts = {n: torch.zeros(p.shape[0]) for n, p in params.items()}
        self._ones = torch.ones(max(p.shape[0] for p in params.values()))  # increments, sliced per update

    def apply_wire(self, params: dict[str, torch.Tensor], sources: list[bytes | RowUpdate]) -> None:
        """``apply`` of a step's contributions as they arrive: peers' payloads still encoded
        (``bytes``) and the worker's own update in its slot. With the compiled kernels
        every payload is decoded and added in one call, straight from the wire, bit for
        bit what decoding each and ``apply`` give (which is the fallback)."""
        own = [s for s in sources if isinstance(s, RowUpdate)]
        if len(own) <= 1 and all(u.touched is None and not u.elements for u in own):
            wire = [s.rows if isinstance(s, RowUpdate) else s for s in sources]
            if native.apply_payloads(
                params, self.counts, wire, self._divides(len(sources)), self.per or 1.0, ELEMENT_COST
            ):
                return
        self.apply(params, [s if isinstance(s, RowUpdate) else RowUpdate.decode(s) for s in sources])

    def _divides(self, contributions: int) -> bool:
        # The sum of no more contributions than its cap divides nothing: it skips the count.
        return self.per is not None and (self.per == 1.0 or contributions > self.per)

    def apply(self, params: dict[str, torch.Tensor], contributions: list[RowUpdate], scale: float = 1.0) -> None:
        """``params += scale * row_mean(contributions)`` (or their sum, capped)."""
        divide = self._divides(len(contributions))
        for name, param in params.items():
            counts = self.counts[name] if divide else None
            touched = (
                []
                if counts is None
                else [t for c in contributions if (t := c.touched_rows(name)) is not None and t.numel()]
            )
            if counts is not None:
                for rows in touched:
                    counts.index_add_(0, rows, self._ones[: rows.numel()])
            for c in contributions:
                entry = c.rows.get(name)
                if entry is not None and entry[0].numel():
                    rows, vals = entry
                    if counts is not None:
                        vals = vals / self._divisor(counts, rows).unsqueeze(1)
                    param.index_add_(0, rows, vals, alpha=scale)
                elements = c.elements.get(name) if c.elements else None
                if elements is not None and elements[0].numel():
                    rows, flat, vals = elements
                    if counts is not None:
                        vals = vals / self._divisor(counts, rows)
                    param.view(-1).index_add_(0, flat, vals, alpha=scale)
            if counts is not None:
                for rows in touched:
                    counts.index_fill_(0, rows, 0.0)

    def _divisor(self, counts: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        divisor = counts.index_select(0, rows)
        if self.per is not None and self.per != 1.0:
            divisor.div_(self.per)
        return divisor.clamp_(min=1)
