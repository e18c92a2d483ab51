"""The one narrow contract every model keeps, so the sync models never care which runs.

A model owns its replica (``params``: named 2-D tensors) and its optimiser state. Per
step it turns one minibatch into a row-sparse *local update* without applying it
(``local_update``); the engine decides what to apply and when (``apply``). Everything a
worker needs to resume lives in ``state_arrays``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from ebb.sparse import RowUpdate, apply_update


def loss_value(loss_name: str, loss_sum: float, samples: int) -> float:
    """The reported loss from summed per-sample losses (RMSE takes the root of the mean)."""
    mean = loss_sum / max(samples, 1)
    return float(np.sqrt(mean)) if loss_name == "rmse" else float(mean)


class Model(ABC):
    kind: str  # batch kind consumed: ratings | sparse | dense
    loss_name: str  # what the training loss is: rmse | logloss

    params: dict[str, torch.Tensor]
    optimizer: Any

    @abstractmethod
    def to_batch(self, arrays: dict[str, np.ndarray]) -> Any:
        """Convert a decoded minibatch to the tensors ``local_update`` consumes (cacheable)."""

    @abstractmethod
    def gradients(self, batch: Any) -> tuple[float, int, dict[str, tuple[torch.Tensor, ...]]]:
        """(sum of per-sample losses, samples, {param: (unique rows, gradient rows[, parameter rows])}):
        a model that gathered the parameter's rows anyway may pass them on (see ``RowUpdate.base``)."""

    @abstractmethod
    def predict(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        """(predictions, targets) for a batch: ratings for PMF, probabilities for LR."""

    @abstractmethod
    def metrics(self, pred: np.ndarray, target: np.ndarray) -> dict[str, float]:
        """Test metrics from concatenated predictions and targets."""

    def local_update(self, batch: Any) -> tuple[float, int, RowUpdate]:
        """One optimiser step on ``batch``: returns (loss sum, samples, update) unapplied."""
        loss_sum, n, grads = self.gradients(batch)
        self.optimizer.begin_step()
        update = RowUpdate(
            {name: (g[0], self.optimizer.delta(name, g[0], g[1])) for name, g in grads.items()},
            base={name: g[2] for name, g in grads.items() if len(g) > 2} or None,
        )
        return loss_sum, n, update

    def apply(self, update: RowUpdate, scale: float = 1.0) -> None:
        apply_update(self.params, update, scale)

    # Whether scoring needs one pass over the training split first (see ``observe_training``).
    needs_training_pass: bool = False

    def observe_training(self, batches: Iterable[Any]) -> None:
        """Learn what held-out scoring needs from the training split (PMF: how often each
        user and item was seen). Called once before scoring when ``needs_training_pass``."""
        del batches  # the default model needs nothing from it

    def evaluate(self, batches: Iterable[Any]) -> dict[str, float]:
        preds, targets = zip(*(self.predict(b) for b in batches))
        return self.metrics(np.concatenate(preds), np.concatenate(targets))

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Replica and optimiser state as plain arrays (checkpoints, no pickle)."""
        out = {f"param.{n}": p.numpy() for n, p in self.params.items()}
        out.update({f"opt.{n}": t.numpy() for n, t in self.optimizer.state().items()})
        return out

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        for n, p in self.params.items():
            p.copy_(torch.from_numpy(arrays[f"param.{n}"]))
        self.optimizer.load_state({k[4:]: torch.from_numpy(v) for k, v in arrays.items() if k.startswith("opt.")})

    def replica_arrays(self) -> dict[str, np.ndarray]:
        return {n: p.numpy() for n, p in self.params.items()}

    def average_in(self, other: dict[str, np.ndarray]) -> None:
        """x <- (x + x_other) / 2: how a leaving worker's replica is folded in (MLLess §4.2)."""
        for n, p in self.params.items():
            p.add_(torch.from_numpy(other[n])).mul_(0.5)
