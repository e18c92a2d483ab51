"""The small interfaces the engine talks to. Nothing here knows about AWS or processes."""

from __future__ import annotations

from typing import Iterable, Protocol


class ObjectStore(Protocol):
    """Datasets, checkpoints, models and reports: a flat key -> bytes namespace."""

    def get(self, key: str) -> bytes: ...

    def put(self, key: str, data: bytes) -> None: ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str = "") -> list[str]: ...

    def delete(self, key: str) -> None: ...


class UpdateStore(Protocol):
    """Ephemeral per-step state: each worker's encoded update for a step, and replicas."""

    def publish(self, step: int, worker: int, payload: bytes) -> None: ...

    def fetch(self, step: int, workers: Iterable[int]) -> dict[int, bytes]:
        """Payloads of ``workers`` for ``step``; a worker that sent nothing is absent."""
        ...

    def discard(self, steps: Iterable[int], workers: Iterable[int]) -> None: ...

    def put_blob(self, name: str, payload: bytes) -> None: ...

    def get_blob(self, name: str) -> bytes | None: ...


class SignalChannel(Protocol):
    """Control messages: worker reports up to the supervisor, directives down to workers."""

    def report(self, message: dict) -> None: ...

    def next_reports(self, timeout: float) -> list[dict]:
        """Block up to ``timeout`` s for at least one report; return all that are waiting."""
        ...

    def release(self, step: int, workers: list[int], directive: dict) -> bool:
        """Deliver ``step``'s directive to ``workers`` once all of them have announced the
        step: by the last announcement itself if this comes first (the barrier opens without
        the supervisor), at once if they already have (→ True: the supervisor was late).
        The channel adds ``senders`` and ``last_sent_at`` from the announcements."""
        ...

    def next_directive(self, worker: int, timeout: float) -> dict | None:
        """The next directive for ``worker``, waiting up to ``timeout`` s (0: don't wait)."""
        ...
