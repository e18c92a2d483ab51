"""The engine's errors: what the runner, the handlers and the CLI catch."""

from __future__ import annotations


class EngineError(RuntimeError):
    """The job cannot go on (the message says why, in one line)."""


class RoundLost(EngineError):
    """The round cannot go on (a worker or the update store is gone); it can be run again
    from the last complete round's checkpoints."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, or does not belong to this job."""
