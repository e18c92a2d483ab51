"""Lazy row-sparse optimisers: state advances only for the rows a minibatch touched.

One small class per optimiser with the same contract, in the spirit of ``torch.optim``:
``delta(name, rows, grad)`` takes the gradient of some rows of a parameter and returns
the additive change for those rows, updating its own per-row state on the way. Rows a
minibatch did not touch keep their state untouched (as in MLLess and ``SparseAdam``), so
the cost of a step is proportional to the batch, not the model.
"""

from __future__ import annotations

import torch


class SparseSGD:
    """SGD with optional (Nesterov) momentum, per-row momentum buffers."""

    def __init__(self, params: dict[str, torch.Tensor], lr: float, momentum: float = 0.0, nesterov: bool = False):
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.buffers = {n: torch.zeros_like(p) for n, p in params.items()} if momentum else {}
        self.steps = 0

    def begin_step(self) -> None:
        self.steps += 1

    def delta(self, name: str, rows: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        if self.momentum:
            buf = self.buffers[name]
            rows_buf = buf.index_select(0, rows).mul_(self.momentum).add_(grad)
            buf.index_copy_(0, rows, rows_buf)
            grad = grad.add(rows_buf, alpha=self.momentum) if self.nesterov else rows_buf
        return grad.mul(-self.lr)

    def state(self) -> dict[str, torch.Tensor]:
        out = {f"buf.{n}": b for n, b in self.buffers.items()}
        out["steps"] = torch.tensor([self.steps])
        return out

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        _require(state, self.state())
        for n in self.buffers:
            self.buffers[n].copy_(state[f"buf.{n}"])
        self.steps = int(state["steps"][0])


class SparseAdam:
    """Adam with per-row moments (lazy Adam): only the rows a step touches move.

    Bias correction counts steps per parameter (``row_steps=False``: every step touches
    each parameter, as torch.optim.SparseAdam counts them) or per row (``row_steps=True``:
    a row's correction follows how many times *it* was touched, so a row seen for the
    first time at step 1,000 is corrected as a fresh one; this is torch.optim.SparseAdam
    with every row its own parameter). Per-row counts suit embeddings, whose rows are
    touched at very different rates.
    """

    def __init__(
        self,
        params: dict[str, torch.Tensor],
        lr: float,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        row_steps: bool = False,
        last_touched: tuple[str, ...] = (),
    ):
        self.lr, (self.beta1, self.beta2), self.eps = lr, betas, eps
        # The step at which each row of these parameters was last touched (0: never), for a
        # model that pays per-step costs of the steps a row sat out (sparse LR's hyper.l2_every_step).
        self.last = {n: torch.zeros(params[n].shape[0], 1, dtype=torch.float64) for n in last_touched}
        self.m = {n: torch.zeros_like(p) for n, p in params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in params.items()}
        # float64 counts: exact far past any job's length, and the bias terms are computed in float64.
        self.row_steps = (
            {n: torch.zeros(p.shape[0], 1, dtype=torch.float64) for n, p in params.items()} if row_steps else None
        )
        self.steps = 0

    def begin_step(self) -> None:
        self.steps += 1

    def steps_since_touched(self, name: str, rows: torch.Tensor) -> torch.Tensor:
        """[k, 1] float64: for each row, the steps from its last touch to the coming step
        (``steps + 1``) — 1 for a row the previous step touched, the whole job for a new one."""
        return self.last[name].index_select(0, rows).neg_().add_(self.steps + 1)

    def touched(self, name: str, rows: torch.Tensor) -> None:
        """Record that the current step touched ``rows`` (after ``begin_step``)."""
        self.last[name].index_fill_(0, rows, float(self.steps))

    def delta(self, name: str, rows: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        m_rows = self.m[name].index_select(0, rows).mul_(self.beta1).add_(grad, alpha=1 - self.beta1)
        v_rows = self.v[name].index_select(0, rows).mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        self.m[name].index_copy_(0, rows, m_rows)
        self.v[name].index_copy_(0, rows, v_rows)
        if self.row_steps is None:
            bias1 = 1 - self.beta1**self.steps
            root2 = (1 - self.beta2**self.steps) ** 0.5
            return m_rows.div(v_rows.sqrt().add_(self.eps * root2)).mul_(-self.lr * root2 / bias1)
        counts = self.row_steps[name]
        n = counts.index_select(0, rows).add_(1.0)
        counts.index_copy_(0, rows, n)
        root2 = torch.pow(self.beta2, n).neg_().add_(1.0).sqrt_()  # [k, 1]
        step = root2.div(torch.pow(self.beta1, n).neg_().add_(1.0)).mul_(-self.lr).to(m_rows.dtype)
        return m_rows.div(v_rows.sqrt().add_(root2.mul(self.eps).to(v_rows.dtype))).mul_(step)

    def state(self) -> dict[str, torch.Tensor]:
        out = {f"m.{n}": t for n, t in self.m.items()}
        out.update({f"v.{n}": t for n, t in self.v.items()})
        out.update({f"rowsteps.{n}": t for n, t in (self.row_steps or {}).items()})
        out.update({f"last.{n}": t for n, t in self.last.items()})
        out["steps"] = torch.tensor([self.steps])
        return out

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        _require(state, self.state())
        for n in self.m:
            self.m[n].copy_(state[f"m.{n}"])
            self.v[n].copy_(state[f"v.{n}"])
        for n, t in (self.row_steps or {}).items():
            t.copy_(state[f"rowsteps.{n}"])
        for n, t in self.last.items():
            t.copy_(state[f"last.{n}"])
        self.steps = int(state["steps"][0])


def _require(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """A saved optimiser state must hold what this optimiser keeps (e.g. not momentum for Adam)."""
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(
            f"the saved optimiser state has no {', '.join(missing)} (it holds {', '.join(sorted(state))}):"
            " was it written with another hyper.optimizer (or, for sparse LR, hyper.l2_every_step)?"
        )
