"""In-process implementations, for a single worker running beside its supervisor thread."""

from __future__ import annotations

import queue
import threading
from typing import Iterable


class MemoryUpdateStore:
    def __init__(self):
        self._data: dict[tuple[int, int], bytes] = {}
        self._blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def publish(self, step: int, worker: int, payload: bytes) -> None:
        with self._lock:
            self._data[(step, worker)] = payload

    def fetch(self, step: int, workers: Iterable[int]) -> dict[int, bytes]:
        with self._lock:
            return {w: self._data[(step, w)] for w in workers if (step, w) in self._data}

    def discard(self, steps: Iterable[int], workers: Iterable[int]) -> None:
        with self._lock:
            for s in steps:
                for w in workers:
                    self._data.pop((s, w), None)

    def put_blob(self, name: str, payload: bytes) -> None:
        with self._lock:
            self._blobs[name] = payload

    def get_blob(self, name: str) -> bytes | None:
        with self._lock:
            return self._blobs.get(name)


class MemorySignalChannel:
    def __init__(self):
        self._reports: queue.Queue = queue.Queue()
        self._directives: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()

    def _dq(self, worker: int) -> queue.Queue:
        with self._lock:
            return self._directives.setdefault(worker, queue.Queue())

    def report(self, message: dict) -> None:
        self._reports.put(message)

    def next_reports(self, timeout: float) -> list[dict]:
        try:
            out = [self._reports.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                out.append(self._reports.get_nowait())
            except queue.Empty:
                return out

    def direct(self, workers: Iterable[int], message: dict) -> None:
        for w in workers:
            self._dq(w).put(dict(message))

    def next_directive(self, worker: int, timeout: float) -> dict | None:
        try:
            return self._dq(worker).get(timeout=timeout) if timeout > 0 else self._dq(worker).get_nowait()
        except queue.Empty:
            return None
