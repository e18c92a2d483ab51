"""The metrics sink: what a supervisor shows of each closed step (a progress line locally,
CloudWatch on AWS), and of the finished job."""

from __future__ import annotations

from typing import Any, Protocol


class MetricsSink(Protocol):
    def step(self, record: dict[str, Any]) -> None:
        """A closed step: its ``report.json`` history entry (``step``, ``time``, ``loss``,
        ``epoch``, ``workers``, ``bytes_sent``, ``bytes_received``, ``sent_fraction``,
        ``cost_usd``, ...) and ``active`` (workers from the next step), ``stop`` (the stop
        reason, once there is one), ``timing`` (mean seconds per phase), ``val`` (a held-out
        scoring taken since the last record, or None), ``best_val`` (the best validation
        score so far, or None) and ``watch`` (the stop rule nearest to ending the job:
        ``{"rule", "done", "total"}``)."""
        ...

    def close(self, report: dict[str, Any]) -> None: ...


class NullSink:
    """A sink that shows nothing."""

    def step(self, record: dict[str, Any]) -> None:
        pass

    def close(self, report: dict[str, Any]) -> None:
        pass
