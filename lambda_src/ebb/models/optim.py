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
        for n in self.buffers:
            self.buffers[n].copy_(state[f"buf.{n}"])
        self.steps = int(state["steps"][0])


class SparseAdam:
    """Adam with per-row moments and a global step count for bias correction (lazy Adam)."""

    def __init__(self, params: dict[str, torch.Tensor], lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.lr, (self.beta1, self.beta2), self.eps = lr, betas, eps
        self.m = {n: torch.zeros_like(p) for n, p in params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in params.items()}
        self.steps = 0

    def begin_step(self) -> None:
        self.steps += 1

    def delta(self, name: str, rows: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        m_rows = self.m[name].index_select(0, rows).mul_(self.beta1).add_(grad, alpha=1 - self.beta1)
        v_rows = self.v[name].index_select(0, rows).mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        self.m[name].index_copy_(0, rows, m_rows)
        self.v[name].index_copy_(0, rows, v_rows)
        bias1 = 1 - self.beta1**self.steps
        bias2 = 1 - self.beta2**self.steps
        step_size = self.lr * (bias2**0.5) / bias1
        return m_rows.div(v_rows.sqrt().add_(self.eps * bias2**0.5)).mul_(-step_size)

    def state(self) -> dict[str, torch.Tensor]:
        out = {f"m.{n}": t for n, t in self.m.items()}
        out.update({f"v.{n}": t for n, t in self.v.items()})
        out["steps"] = torch.tensor([self.steps])
        return out

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        for n in self.m:
            self.m[n].copy_(state[f"m.{n}"])
            self.v[n].copy_(state[f"v.{n}"])
        self.steps = int(state["steps"][0])
