"""Time this process was not running: a pause-adjusted clock for judging heartbeats.

A heartbeat's age is wall time since it was written. When the whole job is suspended (a
laptop lid, SIGSTOP of every process, a VM paused), wall time runs on while nobody beats,
and on waking every heartbeat looks stale to whoever looks first, though nobody failed.
So each process notes the gaps in its own running: a thread ticks every ``TICK_S``, and a
tick later than ``PAUSE_MIN_S`` after the one before (noticed by that thread or by whoever
asks first) is a pause. A heartbeat is judged by its age less the pauses this process saw
since it was written: time the judge itself was not running proves nothing about others.

Only the judge's own pauses count: a worker stopped alone is still found silent by a
supervisor that ran all along, and the other way round.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ebb.engine.clock import wall

TICK_S = 0.25
PAUSE_MIN_S = 1.0  # a thread late by more than this was not running (or not scheduled): a pause
KEEP = 64  # pauses remembered (the oldest go first: heartbeats are judged over seconds, not hours)


class PauseClock:
    """Wall time with this process's pauses noted; ``age(t)`` is a heartbeat's adjusted age."""

    def __init__(self, now: Callable[[], float] = wall):
        self._now = now
        self._lock = threading.Lock()
        self._last = now()
        self.pauses: list[tuple[float, float]] = []  # (from, to) in wall seconds
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> float:
        """Note a pause if the last tick is too long ago (once started); returns the time now."""
        with self._lock:
            now = self._now()
            if now - self._last > PAUSE_MIN_S and self._thread is not None:
                self.pauses = (self.pauses + [(self._last, now)])[-KEEP:]
            self._last = max(self._last, now)
            return now

    def paused_since(self, since: float, now: float | None = None) -> float:
        """Seconds this process was paused between ``since`` and now."""
        end = self.tick() if now is None else now
        return sum(max(0.0, min(b, end) - max(a, since)) for a, b in self.pauses)

    def age(self, since: float) -> float:
        """Seconds since ``since`` (a wall time, e.g. a heartbeat's) less this process's pauses."""
        now = self.tick()
        return now - since - self.paused_since(since, now)

    def start(self) -> PauseClock:
        """Tick from a thread of our own, whatever the caller's loop is busy with."""
        if self._thread is None:
            self._stopped.clear()
            with self._lock:
                self._last = self._now()
            self._thread = threading.Thread(target=self._run, name="ebb-pause-clock", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stopped.wait(TICK_S):
            self.tick()
