"""Using a trained model: ``ebb.load_model`` (the artifact, numpy only) and ``ebb predict``
(batch scoring and top-K recommendations of files of any size, locally or on AWS).

Nothing here imports torch: a program that only scores never loads it.
"""

from __future__ import annotations

from ebb.predict.artifact import LogisticModel, RatingsModel, load_model

__all__ = ["load_model", "RatingsModel", "LogisticModel"]
