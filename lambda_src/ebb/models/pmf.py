"""Probabilistic matrix factorisation with biases, trained by SGD + Nesterov momentum or lazy Adam.

Prediction ``r̂ = μ + b_u + b_i + U_u · V_i``. The per-step objective is the *sum* over
the minibatch of ``½(r̂ − r)² + ½λ(|U_u|² + |V_i|² + b_u² + b_i²)`` (per-rating
regularisation, as in Funk-style SGD), so the learning rate means the same thing for
any batch size. Gradients are computed by hand over the unique users and items of the
batch (no autograd): only those rows change.

A row that recurs in a minibatch (``row_grad``) gets the *mean* of its ratings' gradients
(``mean``: every step moves a row about as far, however many of its ratings the batch
holds) or their *sum* (``sum``: the gradient of the minibatch's loss, each rating
pulling as it does alone, what autograd gives a torch model). Under Adam the two differ
in how a row's steps are weighted in its moments: ``sum`` weighs a step by the ratings it
carries, so a row's update follows its data, not the minibatches' composition. Measured
on the four rating presets (docs/DEFAULTS.md), ``sum`` validates better at every l2, under
either optimiser; it is the default.

Where the compiled kernels run, a step is one pass of ``ebb.models.compiled`` with the
same arithmetic; this torch code is its reference and its fallback.

Each bias is stored as the last column of its side's table (``user`` is ``[users,
rank + 1]``): a user's factors and bias always change together, and one row of 21
costs one gather, one filter pass, one wire entry and one scatter-add where a row of
20 and a row of 1 cost two of each — the per-row overhead, not the arithmetic, is
what a worker pays for on every step.

The optimiser (``optimizer``) is ``sgd_momentum`` (per-row Nesterov momentum buffers) or
``adam`` (lazy Adam: per-row moments and per-row bias correction, see
``ebb.models.optim.SparseAdam``). Both keep their state per row, advance it only for
the rows a minibatch touched, and checkpoint it with the replica.

Cold users and items (``cold_k``): a held-out rating whose user or item had at most
``cold_k`` training ratings is predicted from ``μ + b_u + b_i`` alone. A factor row
trained on one or two ratings is mostly its random initialisation and the noise of
those ratings; the biases are the part a few ratings do estimate. Training is unchanged;
scoring needs the training counts, so the engine first passes the training split
through ``observe_training`` (once per model).

Scored predictions (``predict``) are clipped to the rating range when one is given: a
rating scale's bounds are known, and a prediction beyond them is wrong by at least
the excess. Training sees the unclipped prediction, whose gradient is defined everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ebb.catalogue import entry
from ebb.models import compiled, scoring
from ebb.models.base import Model
from ebb.models.metrics import rmse
from ebb.models.optim import SparseAdam, SparseSGD

OPTIMIZERS = ("sgd_momentum", "adam")  # a job's default is the catalogue's (ebb.catalogue)
ROW_GRADS = ("mean", "sum")  # how a row's ratings in a minibatch combine into its gradient


@dataclass
class RatingsBatch:
    users: torch.Tensor  # unique user rows of the batch
    user_of: torch.Tensor  # per rating: position in ``users``
    items: torch.Tensor
    item_of: torch.Tensor
    rating: torch.Tensor
    user_count: torch.Tensor  # ratings per unique user in the batch, [n, 1]
    item_count: torch.Tensor


class PMF(Model):
    kind = "ratings"
    loss_name = entry("pmf").loss_name

    def __init__(
        self,
        num_users: int,
        num_items: int,
        *,
        rank: int,
        lr: float,
        momentum: float,
        l2: float,
        init_std: float,
        global_mean: float,
        seed: int,
        rating_range: tuple[float, float] | None = None,
        optimizer: str = "sgd_momentum",
        cold_k: int = 0,
        row_grad: str = "sum",
    ):
        gen = torch.Generator().manual_seed(seed)
        user, item = torch.zeros(num_users, rank + 1), torch.zeros(num_items, rank + 1)  # biases start at 0
        user[:, :rank] = torch.randn(num_users, rank, generator=gen).mul_(init_std)
        item[:, :rank] = torch.randn(num_items, rank, generator=gen).mul_(init_std)
        self.params = {"user": user, "item": item}
        self.rank, self.l2, self.mu = rank, l2, global_mean
        self.rating_range = rating_range  # (lowest, highest) rating: where scored predictions are clipped
        self.cold_k = cold_k
        if row_grad not in ROW_GRADS:
            raise ValueError(f"hyper.row_grad {row_grad!r} is not one of {', '.join(ROW_GRADS)} (pmf)")
        self.row_grad = row_grad
        self.needs_training_pass = cold_k > 0
        self._cold: tuple[torch.Tensor, torch.Tensor] | None = None  # per user, per item: seen ≤ cold_k times
        if optimizer == "adam":
            self.optimizer = SparseAdam(self.params, lr=lr, row_steps=True)
        elif optimizer == "sgd_momentum":
            self.optimizer = SparseSGD(self.params, lr=lr, momentum=momentum, nesterov=momentum > 0)
        else:
            raise ValueError(f"hyper.optimizer {optimizer!r} is not one of {', '.join(OPTIMIZERS)} (pmf)")

    def to_batch(self, arrays):
        users, user_of = torch.unique(torch.from_numpy(arrays["user"].astype(np.int64)), return_inverse=True)
        items, item_of = torch.unique(torch.from_numpy(arrays["item"].astype(np.int64)), return_inverse=True)
        user_count = torch.bincount(user_of).unsqueeze(1).float()
        item_count = torch.bincount(item_of).unsqueeze(1).float()
        return RatingsBatch(
            users,
            user_of,
            items,
            item_of,
            torch.from_numpy(arrays["rating"].astype(np.float32)),
            user_count,
            item_count,
        )

    def local_update(self, batch: RatingsBatch):
        """In one compiled pass where the kernels run (``ebb.models.compiled``), else in torch."""
        fused = compiled.pmf_update(
            self.params, self.optimizer, batch, self.rank, self.mu, self.l2, row_sum=self.row_grad == "sum"
        )
        return fused if fused is not None else super().local_update(batch)

    def _forward(self, b: RatingsBatch):
        """The batch's rows (U, V), the per-rating rows (Uk, Vk) and the predictions."""
        r = self.rank
        U, V = self.params["user"].index_select(0, b.users), self.params["item"].index_select(0, b.items)
        Uk, Vk = U.index_select(0, b.user_of), V.index_select(0, b.item_of)
        pred = (Uk[:, :r] * Vk[:, :r]).sum(1).add_(Uk[:, r]).add_(Vk[:, r]).add_(self.mu)
        return U, V, Uk, Vk, pred

    def gradients(self, b: RatingsBatch):
        r, lam = self.rank, self.l2
        U, V, Uk, Vk, pred = self._forward(b)
        err = pred.sub_(b.rating)
        loss_sum = float(err.square().sum())
        e = err.unsqueeze(1)
        # d r̂ / d(user row) = [V_i factors, 1], and the other way round for the item row.
        du = torch.cat([Vk[:, :r] * e, e], dim=1)
        dv = torch.cat([Uk[:, :r] * e, e], dim=1)
        g_user = torch.zeros_like(U).index_add_(0, b.user_of, du)
        g_item = torch.zeros_like(V).index_add_(0, b.item_of, dv)
        if self.row_grad == "sum":  # Σ over the row's ratings of (e·x + λ·row): λ once per rating
            g_user.add_(U * (b.user_count * lam))
            g_item.add_(V * (b.item_count * lam))
        else:  # their mean
            g_user.div_(b.user_count).add_(U, alpha=lam)
            g_item.div_(b.item_count).add_(V, alpha=lam)
        return loss_sum, int(err.numel()), {"user": (b.users, g_user, U), "item": (b.items, g_item, V)}

    def observe_training(self, batches) -> None:
        """Count each user's and item's training ratings; mark those seen ≤ ``cold_k`` times."""
        users = torch.zeros(self.params["user"].shape[0], dtype=torch.int64)
        items = torch.zeros(self.params["item"].shape[0], dtype=torch.int64)
        for b in batches:
            users.index_add_(0, b.users, b.user_count[:, 0].long())
            items.index_add_(0, b.items, b.item_count[:, 0].long())
        self._cold = (users <= self.cold_k, items <= self.cold_k)

    def predict(self, b: RatingsBatch):
        """Scored as ``ebb predict`` scores (``ebb.models.scoring``), so the two agree exactly
        (with ``cold_k`` on, held-out scoring also drops the factors of cold users and items)."""
        users, items = b.users.numpy()[b.user_of.numpy()], b.items.numpy()[b.item_of.numpy()]
        cold = None
        if self._cold is not None:
            cold = self._cold[0].numpy()[users] | self._cold[1].numpy()[items]
        pred = scoring.pmf_pairs(
            self.params["user"].numpy(),
            self.params["item"].numpy(),
            users,
            items,
            rank=self.rank,
            mean=self.mu,
            rating_range=self.rating_range,
            cold=cold,
        )
        return pred, b.rating.numpy()

    def metrics(self, pred, target):
        return {"rmse": rmse(pred, target)}
