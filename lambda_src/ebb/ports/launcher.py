"""How a worker is started, and the launcher that starts it (processes, threads, Lambda)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass
class WorkerStart:
    """Where a worker starts: at step 0 with everyone, later as a joiner, or from its
    checkpoint at the start of a later round (``resume``: the checkpoint's key)."""

    worker: int
    members: list[int]
    round: int = 0
    step: int = 0
    cursor: int = 0
    donor_blob: str | None = None  # replica to copy before the first step (a joining worker)
    resume: str | None = None


class WorkerLauncher(Protocol):
    def launch(self, start: WorkerStart) -> None: ...

    def exited(self) -> dict[int, str]:
        """Workers whose process ended abnormally, with how ("was killed by signal 9 (SIGKILL)")."""
        ...

    def stop(self, worker: int) -> None:
        """Make sure a worker given up on is gone (a stalled process is killed)."""
        ...
