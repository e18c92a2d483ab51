"""The update store: ephemeral per-step state shared by a job's workers (Redis, or memory)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class UpdateStore(Protocol):
    """Each worker's encoded update for a step, named blobs (replicas, markers; ``ports.keys``)
    and heartbeats."""

    def publish(self, step: int, worker: int, payload: bytes) -> None: ...

    def fetch(self, step: int, workers: Iterable[int]) -> dict[int, bytes]:
        """Payloads of ``workers`` for ``step``; a worker that sent nothing is absent."""
        ...

    def discard(self, steps: Iterable[int], workers: Iterable[int]) -> None: ...

    def put_blob(self, name: str, payload: bytes) -> None: ...

    def get_blob(self, name: str) -> bytes | None: ...

    def heartbeat(self, worker: int, at: float) -> None:
        """Record that ``worker`` is alive at wall time ``at`` (every second or so)."""
        ...

    def heartbeats(self, workers: Iterable[int]) -> dict[int, float]:
        """Each worker's last heartbeat (wall time); a worker that never beat is absent."""
        ...
