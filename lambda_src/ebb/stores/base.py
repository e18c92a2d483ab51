"""The small interfaces the engine talks to. Nothing here knows about AWS or processes."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ebb.engine.messages import Directive, EndReport, StepReport


def check_key(key: str) -> str:
    """``key`` if it is a valid object key: ``/``-separated segments, none empty, ``.`` or ``..``."""
    if not isinstance(key, str) or any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"invalid object key {key!r}: expected segments like 'train/part-000000'")
    return key


class ObjectStore(Protocol):
    """Datasets, checkpoints, models and reports: a flat key -> bytes namespace.

    Keys are checked by :func:`check_key` (a bad one is a ``ValueError``); ``get`` and
    ``get_file`` of a missing key raise ``KeyError``; ``delete`` of a missing key is a no-op;
    ``list`` returns the sorted keys starting with ``prefix`` (a plain string prefix).
    """

    def get(self, key: str) -> bytes: ...

    def put(self, key: str, data: bytes) -> None: ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str = "") -> list[str]: ...

    def delete(self, key: str) -> None: ...

    def put_file(self, key: str, path: str | os.PathLike) -> None:
        """Store the file at ``path`` under ``key``, streamed (never whole in memory)."""
        ...

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        """Write the object ``key`` to ``path``, streamed; ``path`` appears only when complete."""
        ...


class UpdateStore(Protocol):
    """Ephemeral per-step state: each worker's encoded update for a step, and replicas."""

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


class SignalChannel(Protocol):
    """Control messages (``ebb.engine.messages``): worker reports up to the supervisor,
    directives down to workers. One channel object serves one round of one job."""

    def report(self, message: StepReport | EndReport) -> None: ...

    def next_reports(self, timeout: float) -> list[StepReport | EndReport]:
        """Block up to ``timeout`` s for at least one report; return all that are waiting."""
        ...

    def release(self, step: int, workers: list[int], directive: Directive) -> bool:
        """Deliver ``step``'s directive to ``workers`` once all of them have announced the
        step: by the last announcement itself if this comes first (the barrier opens without
        the supervisor), at once if they already have (→ True: the supervisor was late).
        The channel adds ``senders`` and ``last_sent_at`` from the announcements."""
        ...

    def next_directive(self, worker: int, timeout: float) -> Directive | None:
        """The next directive for ``worker``, waiting up to ``timeout`` s (0: don't wait)."""
        ...
