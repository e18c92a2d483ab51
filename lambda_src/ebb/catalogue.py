"""The models Ebb trains, one row each: what data it reads, how it trains by default, what
it reports. The job spec fills every unset hyper-parameter from here, ``ebb train --help``
and ``ebb spec`` show these defaults, and the models name their loss from here.

Dependency-free on purpose: the spec (and with it the zip functions) imports it.
The defaults train well without tuning on MovieLens- and Criteo-shaped data against a
tuned torch reference; docs/RESULTS.md ("Model quality", and "Defaults across presets"
for PMF's, checked on four rating presets together by bench/defaults.py) has the runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

ModelName = Literal["pmf", "sparse_lr", "lr"]
Optimizer = Literal["sgd_momentum", "adam"]
Combine = Literal["mean", "sum"]


@dataclass(frozen=True)
class ModelEntry:
    """One model's row of the catalogue."""

    name: str
    data: str  # the dataset kind it trains on: ratings | sparse | dense
    reads: str  # which raw formats give that kind (for --help)
    hyper: Mapping[str, float]  # hyper-parameters left unset take these
    optimizer: Optimizer  # hyper.optimizer when unset
    optimizers: tuple[Optimizer, ...]  # the ones it can train with
    # How a step's updates meet (sync.combine): a row moves by the mean of its touchers'
    # proposals, or by their sum (as if taken in turn). Adam's proposal is about lr per
    # entry whatever the gradient, so an Adam model sums (averaged, a feature every worker
    # sees would move 1/P as far as a rare one); SGD with momentum averages (summed, its
    # proposals overshoot).
    combine: Combine
    # ISP's threshold v (sync.significance): the highest that still converges like BSP at
    # the benchmark's fleet sizes, for the fewest bytes.
    significance: float
    # stop.max_epochs without a validation split, where nothing watches for overfitting:
    # about where one worker stops improving (running short is safer than overfitting).
    max_epochs_without_val: float
    loss_name: str  # the training loss, and the held-out metric early stopping watches
    metric_names: tuple[str, ...]  # what test_metrics reports
    adam_lr: float | None = None  # hyper.lr when unset and the optimiser is Adam (not the SGD default)


CATALOGUE: Mapping[str, ModelEntry] = MappingProxyType(
    {
        "pmf": ModelEntry(
            name="pmf",
            data="ratings",
            reads="MovieLens ratings",
            hyper=MappingProxyType(
                {"rank": 20, "lr": 0.02, "momentum": 0.8, "l2": 0.1, "init_std": 0.1, "lr_decay": 0.95, "cold_k": 0}
            ),
            optimizer="sgd_momentum",
            optimizers=("sgd_momentum", "adam"),
            adam_lr=0.03,
            combine="mean",
            significance=0.4,
            max_epochs_without_val=30,
            loss_name="rmse",
            metric_names=("rmse",),
        ),
        "sparse_lr": ModelEntry(
            name="sparse_lr",
            data="sparse",
            reads="Criteo, LibSVM",
            hyper=MappingProxyType({"lr": 0.01, "l2": 3e-5, "lr_decay": 1.0}),
            optimizer="adam",
            optimizers=("adam",),
            combine="sum",
            significance=0.2,
            max_epochs_without_val=5,
            loss_name="logloss",
            metric_names=("logloss", "accuracy", "auc"),
        ),
        "lr": ModelEntry(
            name="lr",
            data="dense",
            reads="dense CSV",
            hyper=MappingProxyType({"lr": 0.05, "l2": 1e-5, "lr_decay": 1.0}),
            optimizer="adam",
            optimizers=("adam",),
            combine="mean",
            significance=0.7,
            max_epochs_without_val=10,
            loss_name="logloss",
            metric_names=("logloss", "accuracy", "auc"),
        ),
    }
)
MODEL_NAMES: tuple[str, ...] = tuple(CATALOGUE)


def entry(model: str) -> ModelEntry:
    """The catalogue's row for ``model`` (a ``KeyError`` naming the known ones otherwise)."""
    try:
        return CATALOGUE[model]
    except KeyError:
        raise KeyError(f"unknown model {model!r}: one of {', '.join(CATALOGUE)}") from None


def per_model(column: str) -> str:
    """A column of every row, for help text: ``"pmf 0.4, sparse_lr 0.2, lr 0.7"``."""
    return ", ".join(f"{name} {_show(getattr(row, column))}" for name, row in CATALOGUE.items())


def per_model_hyper(key: str) -> str:
    """One hyper-parameter's default of every model that has it: ``"pmf 0.02, sparse_lr 0.01, lr 0.05"``."""
    return ", ".join(f"{name} {_show(row.hyper[key])}" for name, row in CATALOGUE.items() if key in row.hyper)


def _show(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
