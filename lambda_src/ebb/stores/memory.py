"""In-process implementations, for a single worker running beside its supervisor thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable

from ebb.ports.messages import Directive, EndReport, StepReport, decode_directive, decode_report, encode


class MemoryUpdateStore:
    def __init__(self):
        self._data: dict[tuple[int, int], bytes] = {}
        self._blobs: dict[str, bytes] = {}
        self._beats: dict[int, float] = {}
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

    def heartbeat(self, worker: int, at: float) -> None:
        with self._lock:
            self._beats[worker] = at

    def heartbeats(self, workers: Iterable[int]) -> dict[int, float]:
        with self._lock:
            return {w: self._beats[w] for w in workers if w in self._beats}


class MemorySignalChannel:
    """The same contract as the Redis channel: the step's last report or the supervisor's
    release, whichever comes second, delivers the step's directive. Messages travel in
    their wire encoding, so this channel holds the engine to it as the others do."""

    def __init__(self):
        self._reports: queue.Queue = queue.Queue()
        self._directives: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        self._steps: dict[int, dict] = {}  # step -> {count, senders, last_sent_at, staged}

    def _dq(self, worker: int) -> queue.Queue:
        with self._lock:
            return self._directives.setdefault(worker, queue.Queue())

    def _step(self, t: int) -> dict:
        return self._steps.setdefault(t, {"count": 0, "senders": [], "last_sent_at": 0.0, "staged": None})

    def _deliver(self, t: int, workers: list[int], directive: Directive) -> None:
        state = self._steps.pop(t)
        body = encode(
            directive.model_copy(update={"senders": sorted(state["senders"]), "last_sent_at": state["last_sent_at"]})
        )
        for w in workers:
            self._directives.setdefault(w, queue.Queue()).put(body)

    def report(self, message: StepReport | EndReport) -> None:
        if isinstance(message, StepReport):
            with self._lock:
                state = self._step(message.step)
                state["count"] += 1
                if message.sent_bytes:
                    state["senders"].append(message.worker)
                state["last_sent_at"] = max(state["last_sent_at"], message.sent_at)
                # A staged directive says who trains the step (a lost worker is no longer counted).
                if state["staged"] is not None and state["count"] >= len(state["staged"][0]):
                    self._deliver(message.step, *state["staged"])
        self._reports.put(encode(message))

    def release(self, step: int, workers: list[int], directive: Directive) -> bool:
        with self._lock:
            state = self._step(step)
            if state["count"] >= len(workers):
                self._deliver(step, list(workers), directive)
                return True
            state["staged"] = (list(workers), directive)
            return False

    def next_reports(self, timeout: float) -> list[StepReport | EndReport]:
        try:
            out = [self._reports.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                out.append(self._reports.get_nowait())
            except queue.Empty:
                return [decode_report(m) for m in out]

    def next_directive(self, worker: int, timeout: float) -> Directive | None:
        try:
            raw = self._dq(worker).get(timeout=timeout) if timeout > 0 else self._dq(worker).get_nowait()
        except queue.Empty:
            return None
        return decode_directive(raw)
