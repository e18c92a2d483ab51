"""Logistic regression: sparse (hashed features, CSR batches) and dense, trained by Adam.

Objective per step: mean binary cross-entropy over the minibatch plus ``½λ|w_touched|²``.
The sparse model touches only the feature rows present in the batch; the dense model
touches every row (its updates are dense, so the significance filter decides all of
them).

Sparse LR's ``l2_every_step``: the penalty ``½λ|w|²`` of *every* step on *every* feature,
as a dense regulariser (torch's Adam ``weight_decay``) charges it, paid lazily: a feature
sat out by k − 1 steps gets ``k·λ·w`` in its gradient when a step next touches it — the
sum of the penalty's gradients over those steps, exactly, since a lazy model leaves an
untouched row where it is. The optimiser keeps the step each feature was last touched
(checkpointed with it). Rare features are thereby shrunk by their idle time, not only by
their few touches: on the Criteo-shaped data validation and test log-loss fall 0.5–0.7 %
(docs/RESULTS-TOOLS.md §10), past the torch reference that reaches it only with dense
weight decay. Where the compiled kernels run, a sparse LR step is one pass of
``ebb.models.compiled``; the torch code here is its reference and its fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ebb.catalogue import entry
from ebb.models import compiled, scoring
from ebb.models.base import Model
from ebb.models.metrics import classification_metrics
from ebb.models.optim import SparseAdam

_BIAS_ROW = torch.zeros(1, dtype=torch.int64)


@dataclass
class SparseBatch:
    features: torch.Tensor  # unique feature rows of the batch
    feature_of: torch.Tensor  # per non-zero: position in ``features``
    sample_of: torch.Tensor  # per non-zero: its sample (row) in the batch
    values: torch.Tensor
    label: torch.Tensor


@dataclass
class DenseBatch:
    x: torch.Tensor
    label: torch.Tensor


class _Logistic(Model):
    loss_name = entry("sparse_lr").loss_name  # and dense LR's (the catalogue says the same)

    def __init__(self, num_features: int, *, lr: float, l2: float, seed: int, l2_every_step: bool = False):
        self.params = {"weight": torch.zeros(num_features, 1), "bias": torch.zeros(1, 1)}
        self.l2 = l2
        self.l2_every_step = l2_every_step
        self.optimizer = SparseAdam(self.params, lr=lr, last_touched=("weight",) if l2_every_step else ())

    def _l2_rows(self, rows: torch.Tensor) -> torch.Tensor | None:
        """``l2_every_step``: each row's l2 for the coming step, λ × the steps since its last
        touch ([k, 1] float32); None: λ for every touched row."""
        if not self.l2_every_step:
            return None
        return self.optimizer.steps_since_touched("weight", rows).mul_(self.l2).to(torch.float32)

    def _grads(self, logits, label, weight_rows, feature_grad_fn):
        loss_sum = float(F.binary_cross_entropy_with_logits(logits, label, reduction="sum"))
        n = int(label.numel())
        g = (torch.sigmoid(logits) - label).div_(n)
        w = self.params["weight"].index_select(0, weight_rows)
        l2_rows = self._l2_rows(weight_rows)
        if l2_rows is None:
            g_weight = feature_grad_fn(g).add_(w, alpha=self.l2)
        else:  # two roundings, as the kernel's
            g_weight = feature_grad_fn(g).add_(w * l2_rows)
        grads = {"weight": (weight_rows, g_weight), "bias": (_BIAS_ROW, g.sum().reshape(1, 1))}
        return loss_sum, n, grads

    def metrics(self, pred, target):
        return classification_metrics(pred, target)


class SparseLR(_Logistic):
    kind = "sparse"

    def to_batch(self, arrays):
        indptr = torch.from_numpy(arrays["indptr"].astype(np.int64))
        features, feature_of = torch.unique(torch.from_numpy(arrays["indices"].astype(np.int64)), return_inverse=True)
        sample_of = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr.diff())
        return SparseBatch(
            features,
            feature_of,
            sample_of,
            torch.from_numpy(arrays["values"].astype(np.float32)),
            torch.from_numpy(arrays["label"].astype(np.float32)),
        )

    def local_update(self, batch: SparseBatch):
        """In one compiled pass where the kernels run (``ebb.models.compiled``), else in torch
        (which then records the step's touches for ``l2_every_step``, as the kernel does)."""
        last = self.optimizer.last.get("weight")
        fused = compiled.sparse_lr_update(self.params, self.optimizer, batch, self.l2, last)
        if fused is not None:
            return fused
        out = super().local_update(batch)
        if last is not None:
            self.optimizer.touched("weight", batch.features)
        return out

    def _logits(self, b: SparseBatch):
        w = self.params["weight"].index_select(0, b.features)[:, 0]
        contrib = w.index_select(0, b.feature_of) * b.values
        return torch.zeros(b.label.numel()).index_add_(0, b.sample_of, contrib).add_(self.params["bias"][0, 0])

    def gradients(self, b: SparseBatch):
        def feature_grad(g):
            per_nnz = (g[b.sample_of] * b.values).unsqueeze(1)
            return torch.zeros(b.features.numel(), 1).index_add_(0, b.feature_of, per_nnz)

        return self._grads(self._logits(b), b.label, b.features, feature_grad)

    def predict(self, b: SparseBatch):
        """Scored as ``ebb predict`` scores (``ebb.models.scoring``), so the two agree exactly."""
        indices = b.features.numpy()[b.feature_of.numpy()]
        indptr = np.zeros(b.label.numel() + 1, dtype=np.int64)
        np.cumsum(np.bincount(b.sample_of.numpy(), minlength=b.label.numel()), out=indptr[1:])
        logits = scoring.sparse_logits(
            self.params["weight"].numpy(), float(self.params["bias"][0, 0]), indptr, indices, b.values.numpy()
        )
        return scoring.sigmoid(logits), b.label.numpy()


class DenseLR(_Logistic):
    kind = "dense"

    def __init__(self, num_features: int, **kw):
        super().__init__(num_features, **kw)
        self._all_rows = torch.arange(num_features)

    def to_batch(self, arrays):
        return DenseBatch(
            torch.from_numpy(arrays["x"].astype(np.float32)), torch.from_numpy(arrays["label"].astype(np.float32))
        )

    def _logits(self, b: DenseBatch):
        return (b.x @ self.params["weight"])[:, 0] + self.params["bias"][0, 0]

    def gradients(self, b: DenseBatch):
        return self._grads(self._logits(b), b.label, self._all_rows, lambda g: (b.x.T @ g).unsqueeze(1))

    def predict(self, b: DenseBatch):
        logits = scoring.dense_logits(self.params["weight"].numpy(), float(self.params["bias"][0, 0]), b.x.numpy())
        return scoring.sigmoid(logits), b.label.numpy()
