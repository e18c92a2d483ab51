"""How often things happen, in steps: the learning rate's decay and the held-out scorings
(docs/ARCHITECTURE.md, "Validation and early stopping")."""

from __future__ import annotations

from ebb.ports.manifest import Manifest
from ebb.spec import JobSpec


def one_worker_epoch(spec: JobSpec, num_parts: int) -> int:
    """One worker's epoch of progress, in steps of the initial fleet.

    Under ``sync.combine`` sum a step adds its P workers' proposals, so an epoch
    (``num_parts / P`` steps) is one worker's epoch of progress; under mean a step moves a
    row by about one worker's proposal, so it takes ``num_parts`` steps (P epochs). The
    decay of ``hyper.lr_decay`` and the default scoring interval both count in this unit,
    so they mean the same at any fleet size (docs/RESULTS.md, "Model quality", has the
    runs that set it).
    """
    if spec.sync.combine == "sum":
        return max(1, -(-num_parts // spec.workers))
    return max(1, num_parts)


def eval_interval(spec: JobSpec, manifest: Manifest) -> int:
    """Steps between scorings of the held-out split (0: never). By default one worker's
    epoch of progress apart when the data has a validation split (early stopping needs
    it), else never."""
    if spec.stop.eval_every is not None:
        return spec.stop.eval_every
    if manifest.has_val:
        return one_worker_epoch(spec, len(manifest.train.parts))
    return 0


def learning_rate(spec: JobSpec, base_lr: float, step: int, members: int, num_parts: int) -> float:
    """The learning rate at ``step`` with ``members`` workers training.

    It falls by ``hyper.lr_decay`` once every :func:`one_worker_epoch` steps: decaying per
    pass over the data would decay P times too fast at P workers under the mean. Below
    the initial fleet, ``scaling.scale_lr`` scales it by p/P (the linear scaling rule;
    under the sum a smaller fleet's steps shrink by themselves).
    """
    decay = spec.hyper.lr_decay
    assert decay is not None  # the spec fills it from the model catalogue
    lr = base_lr * decay ** (step // one_worker_epoch(spec, num_parts))
    if spec.scaling.scale_lr and members < spec.workers and spec.sync.combine == "mean":
        lr *= members / spec.workers
    return lr
