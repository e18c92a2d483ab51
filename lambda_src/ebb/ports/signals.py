"""The signal channel: worker reports up to the supervisor, directives down to workers."""

from __future__ import annotations

from typing import Protocol

from ebb.ports.messages import Directive, Report


class SignalChannel(Protocol):
    """Control messages (``ports.messages``) of one round of one job."""

    def report(self, message: Report) -> None: ...

    def next_reports(self, timeout: float) -> list[Report]:
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
