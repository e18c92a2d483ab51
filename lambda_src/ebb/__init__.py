"""Ebb: sparse LR and matrix factorisation trained on serverless fleets.

``ebb.load_model(PATH_or_s3)`` loads a trained model for scoring (numpy only; see
``ebb.predict``).
"""

from __future__ import annotations

from typing import Any


def load_model(location: Any) -> Any:
    """A trained model from a run's folder or ``s3://`` prefix: ``predict(rows)`` and, for
    PMF, ``recommend(user_ids, k, exclude_seen=True)`` (``ebb.predict.artifact``)."""
    from ebb.predict.artifact import load_model as _load

    return _load(location)


__all__ = ["load_model"]
