"""Models (PMF, sparse LR, dense LR), their lazy row-sparse optimisers and metrics.

The torch models load on first use (PEP 562 ``__getattr__``), so the numpy-only modules
here (``metrics``, ``scoring``) import without torch: ``ebb.load_model`` and ``ebb
predict`` score with them in programs that never import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ebb.catalogue import data_defaults, entry

if TYPE_CHECKING:
    from ebb.models.base import Model, loss_value
    from ebb.models.logistic import DenseLR, SparseLR
    from ebb.models.pmf import PMF

_LAZY = {
    "Model": "ebb.models.base",
    "loss_value": "ebb.models.base",
    "PMF": "ebb.models.pmf",
    "SparseLR": "ebb.models.logistic",
    "DenseLR": "ebb.models.logistic",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ebb.models' has no attribute {name!r}")


def rating_range(manifest) -> tuple[float, float] | None:
    """The training split's lowest and highest rating (where PMF clips what it scores);
    None for a manifest that does not record them. The held-out splits are not looked at."""
    low, high = manifest.stats.get("rating_min"), manifest.stats.get("rating_max")
    return None if low is None or high is None else (float(low), float(high))


def auto_hyper(name: str, manifest, hp=None) -> dict[str, float]:
    """The data-dependent defaults (catalogue ``auto``) that ``hp`` leaves unset (all of them
    without ``hp``), computed from the manifest's training split: what a job of model
    ``name`` trains with (the report's ``auto_hyper``). An explicit value is never replaced."""
    shape = {"ratings": manifest.train.rows}
    if manifest.kind == "ratings":
        shape.update(users=manifest.num_users, items=manifest.num_items)
    return {k: v for k, v in data_defaults(name, **shape).items() if hp is None or getattr(hp, k) is None}


def resolve_hyper(name: str, manifest, hp):
    """``hp`` with its unset data-dependent defaults filled in (:func:`auto_hyper`)."""
    auto = auto_hyper(name, manifest, hp)
    return hp.model_copy(update=auto) if auto else hp


def build_model(name: str, manifest, hp, seed: int) -> Model:
    """Build model ``name`` sized from a dataset ``manifest`` with hyper-parameters ``hp``
    (unset data-dependent ones resolved from the manifest: :func:`resolve_hyper`)."""
    expected = entry(name).data
    if manifest.kind != expected:
        raise ValueError(f"model {name!r} needs a {expected} dataset, but {manifest.format!r} data is {manifest.kind}")
    hp = resolve_hyper(name, manifest, hp)
    if name == "pmf":
        from ebb.models.pmf import PMF

        return PMF(
            manifest.num_users,
            manifest.num_items,
            rank=hp.rank,
            lr=hp.lr,
            momentum=hp.momentum,
            l2=hp.l2,
            init_std=hp.init_std,
            global_mean=float(manifest.stats.get("rating_mean", 0.0)),
            seed=seed,
            rating_range=rating_range(manifest),
            optimizer=hp.optimizer or entry(name).optimizer,
            cold_k=int(hp.cold_k or 0),
            row_grad=str(hp.row_grad or entry(name).hyper["row_grad"]),
        )
    from ebb.models.logistic import DenseLR, SparseLR

    if name == "sparse_lr":
        return SparseLR(manifest.num_features, lr=hp.lr, l2=hp.l2, seed=seed, l2_every_step=bool(hp.l2_every_step))
    return DenseLR(manifest.num_features, lr=hp.lr, l2=hp.l2, seed=seed)


__all__ = [
    "Model",
    "PMF",
    "SparseLR",
    "DenseLR",
    "auto_hyper",
    "build_model",
    "loss_value",
    "rating_range",
    "resolve_hyper",
]
