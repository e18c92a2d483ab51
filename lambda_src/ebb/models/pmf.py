"""Probabilistic matrix factorisation with biases, trained by SGD + Nesterov momentum.

Prediction ``r̂ = μ + b_u + b_i + U_u · V_i``. The per-step objective is the *sum* over
the minibatch of ``½(r̂ − r)² + ½λ(|U_u|² + |V_i|² + b_u² + b_i²)`` (per-rating
regularisation, as in Funk-style SGD), so the learning rate means the same thing for
any batch size. Gradients are computed by hand over the unique users and items of the
batch (no autograd): only those rows change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ebb.models.base import Model
from ebb.models.metrics import rmse
from ebb.models.optim import SparseSGD


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
    loss_name = "rmse"

    def __init__(self, num_users: int, num_items: int, *, rank: int, lr: float, momentum: float, l2: float,
                 init_std: float, global_mean: float, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.params = {
            "user": torch.randn(num_users, rank, generator=gen).mul_(init_std),
            "item": torch.randn(num_items, rank, generator=gen).mul_(init_std),
            "user_bias": torch.zeros(num_users, 1),
            "item_bias": torch.zeros(num_items, 1),
        }
        self.l2, self.mu = l2, global_mean
        self.optimizer = SparseSGD(self.params, lr=lr, momentum=momentum, nesterov=momentum > 0)

    def to_batch(self, arrays):
        users, user_of = torch.unique(torch.from_numpy(arrays["user"].astype(np.int64)), return_inverse=True)
        items, item_of = torch.unique(torch.from_numpy(arrays["item"].astype(np.int64)), return_inverse=True)
        user_count = torch.bincount(user_of).unsqueeze(1).float()
        item_count = torch.bincount(item_of).unsqueeze(1).float()
        return RatingsBatch(users, user_of, items, item_of, torch.from_numpy(arrays["rating"].astype(np.float32)),
                            user_count, item_count)

    def _rows(self, b: RatingsBatch):
        p = self.params
        return (p["user"].index_select(0, b.users), p["item"].index_select(0, b.items),
                p["user_bias"].index_select(0, b.users), p["item_bias"].index_select(0, b.items))

    def gradients(self, b: RatingsBatch):
        U, V, bu, bi = self._rows(b)
        Uk, Vk = U.index_select(0, b.user_of), V.index_select(0, b.item_of)
        err = ((Uk * Vk).sum(1).add_(bu.index_select(0, b.user_of)[:, 0]).add_(bi.index_select(0, b.item_of)[:, 0])
               .add_(self.mu).sub_(b.rating))
        loss_sum = float(err.square().sum())
        e = err.unsqueeze(1)
        lam = self.l2
        g_user = torch.zeros_like(U).index_add_(0, b.user_of, e * Vk).div_(b.user_count).add_(U, alpha=lam)
        g_item = torch.zeros_like(V).index_add_(0, b.item_of, e * Uk).div_(b.item_count).add_(V, alpha=lam)
        g_ubias = torch.zeros_like(bu).index_add_(0, b.user_of, e).div_(b.user_count).add_(bu, alpha=lam)
        g_ibias = torch.zeros_like(bi).index_add_(0, b.item_of, e).div_(b.item_count).add_(bi, alpha=lam)
        grads = {"user": (b.users, g_user), "item": (b.items, g_item),
                 "user_bias": (b.users, g_ubias), "item_bias": (b.items, g_ibias)}
        return loss_sum, int(err.numel()), grads

    def predict(self, b: RatingsBatch):
        U, V, bu, bi = self._rows(b)
        pred = (U[b.user_of] * V[b.item_of]).sum(1) + bu[b.user_of, 0] + bi[b.item_of, 0] + self.mu
        return pred.numpy(), b.rating.numpy()

    def metrics(self, pred, target):
        return {"rmse": rmse(pred, target)}
