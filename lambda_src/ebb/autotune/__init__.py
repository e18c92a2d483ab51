"""Scaling decisions: MLLess's scale-in auto-tuner and the policies built on it."""

from .curves import LocalCurve, ReferenceCurve, fit_local, fit_reference
from .knee import KneeDetector, find_knee, smooth_points
from .policies import (
    POLICIES,
    AutoTunePolicy,
    NoScaling,
    ScaleDecision,
    ScalingPolicy,
    SchedulePolicy,
    StepSeen,
    make_policy,
    pick_eviction,
)
from .tuner import ScaleInTuner

__all__ = [
    "POLICIES",
    "AutoTunePolicy",
    "KneeDetector",
    "LocalCurve",
    "NoScaling",
    "ReferenceCurve",
    "ScaleDecision",
    "ScaleInTuner",
    "ScalingPolicy",
    "SchedulePolicy",
    "StepSeen",
    "find_knee",
    "fit_local",
    "fit_reference",
    "make_policy",
    "pick_eviction",
    "smooth_points",
]
