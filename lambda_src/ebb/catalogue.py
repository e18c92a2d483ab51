"""The models Ebb trains, one row each: what data it reads, how it trains by default, what
it reports. The job spec fills every unset hyper-parameter from here, ``ebb train --help``
and ``ebb spec`` show these defaults, and the models name their loss from here.

Dependency-free on purpose: the spec (and with it the zip functions) imports it.
The defaults train well without tuning on MovieLens- and Criteo-shaped data against a
tuned torch reference; docs/RESULTS.md ("Model quality", and "Defaults across presets"
for PMF's, checked on four rating presets together by bench/defaults.py) has the runs.

A few defaults depend on the data (``auto``, like scikit-learn's ``gamma='scale'``): PMF's
``l2`` comes from the training split's shape (:func:`auto_l2`); the model layer fills it
from the manifest when the job leaves it unset (``ebb.models.resolve_hyper``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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
    hyper: Mapping[str, float | str]  # hyper-parameters left unset take these
    optimizer: Optimizer  # hyper.optimizer when unset
    optimizers: tuple[Optimizer, ...]  # the ones it can train with
    # How a step's updates meet (sync.combine): a row moves by the mean of its touchers'
    # proposals, or by their sum (as if taken in turn). Adam's proposal is about lr per
    # entry whatever the gradient, so an Adam model sums (averaged, a feature every worker
    # sees would move 1/P as far as a rare one); SGD with momentum averages (summed, its
    # proposals overshoot). PMF averages under either optimiser: its defaults (lazy Adam)
    # were measured so (docs/DEFAULTS.md).
    combine: Combine
    # ISP's threshold v (sync.significance): the highest that still converges like BSP at
    # the benchmark's fleet sizes, for the fewest bytes.
    significance: float
    # stop.max_epochs without a validation split, where nothing watches for overfitting:
    # about where one worker stops improving (running short is safer than overfitting).
    max_epochs_without_val: float
    loss_name: str  # the training loss, and the held-out metric early stopping watches
    metric_names: tuple[str, ...]  # what test_metrics reports
    # hyper.lr when unset and the job chose another optimiser than the model's default
    # (SGD's learning rate means something else than Adam's), by optimiser.
    other_lr: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # Hyper-parameters whose default is computed from the training data (data_defaults),
    # each with its rule in words; --help and `ebb spec` show "auto (<rule>)".
    auto: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


# PMF's l2 when unset: L2_AT × min(1, L2_N / n)^L2_EXP (at least L2_MIN), where
# n = training ratings / √(users × items) is the geometric mean of the ratings per user and
# per item (one l2 serves both sides). Why it falls with n: each step adds l2 × row to the
# mean gradient of a row's ratings in the minibatch, so over an epoch a row is pulled to
# zero once per rating it has (Funk's per-rating regularisation): its prior grows with its
# data. MAP under a fixed prior would have l2 ∝ 1 / n. Sparse rows want Funk's constant
# (the MovieLens-100k shapes, n 33 and 64, do best at 0.12–0.14); dense ones over-shrink
# under it (ML-10M's shape, n 340, trains 2× slower at 0.1 than at 0.05; issue 25), so
# past L2_N it falls, with an exponent between Funk's 0 and the fixed prior's 1. Fitted on
# the four presets and the ML-10M shape (docs/DEFAULTS.md); at the Netflix Prize's shape
# (n ≈ 1,100) it gives 0.016, near the per-rating 0.015 Funk used there.
L2_AT, L2_N, L2_EXP = 0.14, 60.0, 0.75
L2_MIN = 0.005  # far past the densest shape measured, keep some prior


def auto_l2(ratings: int, users: int, items: int) -> float:
    """PMF's ``hyper.l2`` when unset, from the training split's shape (3 significant figures)."""
    n = ratings / max(1.0, (max(1, users) * max(1, items)) ** 0.5)
    value = L2_AT * min(1.0, L2_N / max(n, 1e-9)) ** L2_EXP
    return float(f"{max(L2_MIN, value):.3g}")


AUTO_L2 = f"{L2_AT:g} × min(1, {L2_N:g} / n)^{L2_EXP:g}, at least {L2_MIN:g}, n = training ratings / √(users × items)"


CATALOGUE: Mapping[str, ModelEntry] = MappingProxyType(
    {
        "pmf": ModelEntry(
            name="pmf",
            data="ratings",
            reads="MovieLens ratings",
            hyper=MappingProxyType(
                {
                    "rank": 20,
                    "lr": 0.03,
                    "momentum": 0.8,
                    "init_std": 0.1,
                    "lr_decay": 0.95,
                    "cold_k": 0,
                    # A recurring row's gradient sums its ratings' (the minibatch loss's gradient):
                    # 0.3-0.7 % lower test RMSE than their mean on every preset at 1 and 4
                    # workers, and 220 steps to ML-10M's target against 240 (docs/DEFAULTS.md).
                    "row_grad": "sum",
                }
            ),
            auto=MappingProxyType({"l2": AUTO_L2}),
            # Lazy Adam: within 1 % of tuned torch on the four presets at 1 and 4 workers,
            # as SGD with momentum is, and 30 % fewer steps to the target at ML-10M's shape,
            # where SGD is slow to leave the small initial factors (docs/DEFAULTS.md).
            optimizer="adam",
            optimizers=("adam", "sgd_momentum"),
            other_lr=MappingProxyType({"sgd_momentum": 0.02}),
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
            # l2_every_step: every feature pays the l2 of every step (lazily, at its next touch):
            # test log-loss 0.5-0.9 % lower at 1 and 4 workers on the Criteo-shaped data, past
            # torch's dense weight decay (docs/DEFAULTS.md).
            hyper=MappingProxyType({"lr": 0.01, "l2": 3e-5, "lr_decay": 1.0, "l2_every_step": True}),
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
    """One hyper-parameter's default of every model that has it: ``"pmf 0.02, sparse_lr 0.01, lr 0.05"``
    (a data-dependent one as its rule, ``"pmf auto (...)"``)."""
    return ", ".join(
        f"{name} {f'auto ({row.auto[key]})' if key in row.auto else _show(row.hyper[key])}"
        for name, row in CATALOGUE.items()
        if key in row.hyper or key in row.auto
    )


def data_defaults(model: str, *, ratings: int, users: int = 0, items: int = 0) -> dict[str, float]:
    """The ``auto`` hyper-parameters of ``model`` for training data of this shape (``ratings``
    training rows; users and items for ratings data), by name: ``{"l2": 0.062}`` for PMF."""
    return {"l2": auto_l2(ratings, users, items)} if entry(model).name == "pmf" else {}


def _show(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
