"""Test doubles shared by the engine tests (real engine, in-memory channel that records)."""

from __future__ import annotations

from ebb.stores.memory import MemorySignalChannel


class RecordingChannel(MemorySignalChannel):
    """The in-memory signal channel, keeping a copy of every worker report."""

    def __init__(self):
        super().__init__()
        self.log: list[dict] = []

    def report(self, message):
        self.log.append(dict(message))
        super().report(message)
