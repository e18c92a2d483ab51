"""Run a job on this machine: the supervisor here, workers as processes (or, for one
worker, a thread beside it), updates and signals over a private redis-server.

Whatever happens — a finished job, a crash, Ctrl-C — every child process and the
redis-server are stopped before ``run_local`` returns or raises.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
import uuid
from contextlib import ExitStack

import torch

from ebb.engine.supervisor import MetricsSink, Supervisor
from ebb.engine.worker import Worker, WorkerStart
from ebb.local.redis_server import RedisServer
from ebb.spec import JobSpec
from ebb.stores.local import FolderObjectStore
from ebb.stores.memory import MemorySignalChannel, MemoryUpdateStore
from ebb.stores.redis_store import RedisSignalChannel, RedisUpdateStore


WORKER_NICENESS = 5  # the supervisor and redis-server sit on every step's critical path


def _worker_process(spec_json: str, start: WorkerStart, urls: list[str], job: str) -> None:
    torch.set_num_threads(1)
    # Ctrl-C reaches the whole process group: the parent stops us, quietly, in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's unwind-handler: just stop
    # More workers than cores is the norm locally: let the barrier's other parties run first.
    os.nice(WORKER_NICENESS)
    spec = JobSpec.model_validate_json(spec_json)
    updates = RedisUpdateStore(urls, job)
    signals = RedisSignalChannel(urls[0], job)
    try:
        Worker(spec, start, FolderObjectStore(spec.data), updates, signals).run()
    except Exception:
        traceback.print_exc()
        raise SystemExit(1) from None


class ProcessLauncher:
    """Workers as OS processes (fork: cheap start, no torch re-import)."""

    def __init__(self, spec: JobSpec, urls: list[str], job: str):
        self.spec_json, self.urls, self.job = spec.model_dump_json(), urls, job
        self.ctx = mp.get_context("fork")
        self.procs: dict[int, mp.Process] = {}

    def launch(self, start: WorkerStart) -> None:
        p = self.ctx.Process(target=_worker_process, args=(self.spec_json, start, self.urls, self.job),
                             name=f"ebb-worker-{start.worker}", daemon=True)
        p.start()
        self.procs[start.worker] = p

    def failed(self) -> str | None:
        for w, p in self.procs.items():
            if p.exitcode not in (None, 0):
                return f"worker {w} died (exit code {p.exitcode}); see its traceback above"
        return None

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + 5
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()


class ThreadLauncher:
    """Workers as threads in this process, over in-memory stores (one-worker jobs, tests)."""

    def __init__(self, spec: JobSpec, objects, updates, signals, worker_cls: type[Worker] = Worker):
        self.spec, self.objects, self.updates, self.signals = spec, objects, updates, signals
        self.worker_cls = worker_cls
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.workers: dict[int, Worker] = {}

    def launch(self, start: WorkerStart) -> None:
        def body():
            try:
                worker = self.worker_cls(self.spec, start, self.objects, self.updates, self.signals)
                self.workers[start.worker] = worker
                worker.run()
            except Exception as exc:  # surfaced to the supervisor through failed()
                self.errors.append(f"worker {start.worker} failed: {exc!r}\n{traceback.format_exc()}")

        t = threading.Thread(target=body, name=f"ebb-worker-{start.worker}", daemon=True)
        t.start()
        self.threads.append(t)

    def failed(self) -> str | None:
        return self.errors[0] if self.errors else None

    def stop_all(self) -> None:
        for t in self.threads:
            t.join(timeout=5)


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into the same orderly unwind as Ctrl-C."""


def _on_sigterm(signum, frame):
    raise Terminated("terminated (SIGTERM)")


def run_local(spec: JobSpec, sink: MetricsSink | None = None, cost_meter=None) -> tuple[dict, Supervisor]:
    """Run ``spec`` to completion here; returns (report, supervisor)."""
    objects = FolderObjectStore(spec.data)
    job = f"{spec.name}-{uuid.uuid4().hex[:6]}"
    with ExitStack() as stack:
        if threading.current_thread() is threading.main_thread():
            # A SIGTERM would otherwise skip the clean-up below and orphan the workers and
            # the redis-server (which runs in its own session).
            previous = signal.signal(signal.SIGTERM, _on_sigterm)
            stack.callback(signal.signal, signal.SIGTERM, previous)
        if spec.workers == 1 and not spec.redis_urls and spec.scaling.policy != "schedule":
            updates, signals = MemoryUpdateStore(), MemorySignalChannel()
            launcher = ThreadLauncher(spec, objects, updates, signals)
        else:
            urls = list(spec.redis_urls) or [stack.enter_context(RedisServer()).url]
            updates, signals = RedisUpdateStore(urls, job), RedisSignalChannel(urls[0], job)
            stack.callback(updates.clear)
            launcher = ProcessLauncher(spec, urls, job)
        stack.callback(launcher.stop_all)
        supervisor = Supervisor(spec, objects, updates, signals, launcher, sink, cost_meter=cost_meter)
        report = supervisor.run()
    return report, supervisor
