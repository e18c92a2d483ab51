"""A worker's state as plain arrays: what its checkpoint holds besides its counters."""

from __future__ import annotations

import numpy as np
import torch

from ebb.engine.isp import SignificanceFilter
from ebb.models import Model


def state_arrays(model: Model, isp: SignificanceFilter | None) -> dict[str, np.ndarray]:
    """Replica (``param.*``), optimiser state (``opt.*``) and ISP accumulators (``isp.*``)."""
    arrays = model.state_arrays()
    if isp is not None:
        arrays.update({f"isp.{name}": acc.numpy() for name, acc in isp.pending.items()})
    return arrays


def load_state_arrays(model: Model, isp: SignificanceFilter | None, arrays: dict[str, np.ndarray]) -> None:
    """Restore what :func:`state_arrays` saved."""
    model.load_state_arrays({k: v for k, v in arrays.items() if not k.startswith("isp.")})
    if isp is not None:
        for name, acc in isp.pending.items():
            acc.copy_(torch.from_numpy(arrays[f"isp.{name}"]))


def copy_replica(model: Model, arrays: dict[str, np.ndarray]) -> None:
    """Make ``model``'s parameters the replica ``arrays`` (a joiner adopting its donor's)."""
    for name, param in model.params.items():
        param.copy_(torch.from_numpy(arrays[name]))
