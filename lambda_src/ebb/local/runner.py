"""Run a job on this machine, round after round as it runs on Lambda: each round a fresh
supervisor and fresh worker processes (or, for one worker, a thread beside it), updates
and signals over a private redis-server; then finalize.

Nothing is carried from one round to the next in memory: the supervisor and every
worker resume from the checkpoints in ``OUT/checkpoints``, which is also what
``ebb train --resume OUT`` continues from after an interrupted run.

Whatever happens — a finished job, a crash, Ctrl-C — every child process and the
redis-server are stopped before ``run_local`` returns or raises.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import signal
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from contextlib import ExitStack

import numpy as np
import redis
import torch
from setproctitle import getproctitle, setproctitle

from ebb.engine import checkpoint
from ebb.engine.errors import EngineError, RoundLost
from ebb.engine.finalize import finalize
from ebb.engine.preflight import check_outputs, preflight
from ebb.engine.supervisor import Supervisor
from ebb.engine.worker import Worker, start_worker
from ebb.local.redis_server import RedisServer, die_with_parent
from ebb.ports.keys import SPEC_KEY
from ebb.ports.launcher import WorkerStart
from ebb.ports.metrics import MetricsSink
from ebb.ports.objects import ObjectStore, is_s3
from ebb.ports.signals import SignalChannel
from ebb.ports.updates import UpdateStore
from ebb.spec import JobSpec
from ebb.stores import join_location, open_object_store
from ebb.stores.memory import MemorySignalChannel, MemoryUpdateStore
from ebb.stores.redis_store import RedisSignalChannel, RedisUpdateStore, connect, redact

WORKER_NICENESS = 5  # the supervisor and redis-server sit on every step's critical path
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def checkpoints_location(spec: JobSpec) -> str:
    return join_location(spec.out_location, "checkpoints")


def _share_host_memory(spec: JobSpec) -> JobSpec:
    """The spec with each worker's part cache within a quarter of this machine's memory
    shared by the fleet: locally every worker's cache is on one host, not in a Lambda of
    its own (24 workers of 1,769 MB budgets would ask for 10 GB)."""
    host_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
    share_mb = host_mb // 4 // max(1, spec.workers)
    if (spec.aws.part_cache_bytes() >> 20) <= share_mb:
        return spec
    return spec.model_copy(update={"aws": spec.aws.model_copy(update={"part_cache_mb": share_mb})})


def _worker_process(
    spec_json: str, start: WorkerStart, urls: list[str], job: str, child_setup: Callable[[int], None] | None = None
) -> None:
    die_with_parent()
    if child_setup is not None:  # before anything connects (e.g. a benchmark moves us into a shaped network)
        child_setup(start.worker)
    spec = _share_host_memory(JobSpec.model_validate_json(spec_json))
    setproctitle(f"ebb worker {start.worker} {spec.name}")  # so an operator (and a fault test) can pick one
    torch.set_num_threads(1)
    # Ctrl-C reaches the whole process group: the parent stops us, quietly, in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's unwind-handler: just stop
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # blocked by the parent around the fork
    # More workers than cores is the norm locally: let the barrier's other parties run first.
    os.nice(WORKER_NICENESS)
    try:
        start_worker(
            spec,
            start,
            data=open_object_store(spec.data),
            checkpoints=open_object_store(checkpoints_location(spec)),
            updates=RedisUpdateStore(urls, job),
            signals=RedisSignalChannel(urls[0], job, start.round),
        ).run()
    except Exception:  # already reported to the supervisor, in one line; the traceback is for debugging
        if os.environ.get("EBB_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        raise SystemExit(1) from None


class ProcessLauncher:
    """Workers as OS processes (fork: cheap start, no torch re-import).

    ``child_setup(worker_id)``, if given, runs first in each new worker process, before it
    opens any store: a caller's hook (a benchmark uses it to put each worker behind its own
    shaped network link); the engine gives it no other meaning.
    """

    def __init__(self, spec: JobSpec, urls: list[str], job: str, child_setup: Callable[[int], None] | None = None):
        self.spec_json, self.urls, self.job = spec.model_dump_json(), urls, job
        self.child_setup = child_setup
        self.ctx = mp.get_context("fork")
        self.procs: dict[int, mp.Process] = {}

    def launch(self, start: WorkerStart) -> None:
        p = self.ctx.Process(
            target=_worker_process,
            args=(self.spec_json, start, self.urls, self.job, self.child_setup),
            name=f"ebb-worker-{start.worker}",
            daemon=True,
        )
        # Until the child has its own handlers, a SIGTERM must not run the parent's (which
        # unwinds the caller's stack: in a fresh fork, that is the parent's code running on).
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            p.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self.procs[start.worker] = p

    def exited(self) -> dict[int, str]:
        out = {}
        for w, p in self.procs.items():
            code = p.exitcode
            if code is not None and code < 0:
                out[w] = f"was killed by signal {-code} ({signal.Signals(-code).name})"
            elif code:
                out[w] = f"exited with code {code}"
        return out

    def stop(self, worker: int) -> None:
        p = self.procs.get(worker)
        if p is not None and p.is_alive():
            p.kill()  # also ends a stopped (SIGSTOP) process
            p.join(5)

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

    def __init__(
        self,
        spec: JobSpec,
        *,
        data: ObjectStore,
        checkpoints: ObjectStore,
        updates: UpdateStore,
        signals: SignalChannel,
        worker_cls: type[Worker] = Worker,
    ):
        self.spec, self.data, self.checkpoints, self.updates, self.signals = spec, data, checkpoints, updates, signals
        self.worker_cls = worker_cls
        self.threads: list[threading.Thread] = []
        self.errors: dict[int, str] = {}
        self.workers: dict[int, Worker] = {}

    def launch(self, start: WorkerStart) -> None:
        def body():
            try:
                worker = start_worker(
                    self.spec,
                    start,
                    data=self.data,
                    checkpoints=self.checkpoints,
                    updates=self.updates,
                    signals=self.signals,
                    worker_cls=self.worker_cls,
                )
                self.workers[start.worker] = worker
                worker.run()
            except Exception as exc:  # reported by the worker; kept for the supervisor's liveness check
                self.errors[start.worker] = f"failed: {type(exc).__name__}: {exc}"

        t = threading.Thread(target=body, name=f"ebb-worker-{start.worker}", daemon=True)
        t.start()
        self.threads.append(t)

    def exited(self) -> dict[int, str]:
        return dict(self.errors)

    def stop(self, worker: int) -> None:
        if worker in self.workers:
            self.workers[worker].cancelled.set()

    def stop_all(self) -> None:
        for worker in self.workers.values():
            worker.cancelled.set()
        for t in self.threads:
            t.join(timeout=5)


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into the same orderly unwind as Ctrl-C."""


class _StopSignals:
    """Ctrl-C and SIGTERM as an orderly unwind, remembered as well as raised.

    CPython drops an exception raised while a destructor or weakref callback runs (it
    prints "Exception ignored in ..." and carries on: cpython#95959), so a signal that
    lands there would be lost and the job would train on. ``pending()`` hands the
    supervisor's loop the interrupt again on its next poll."""

    def __init__(self):
        self.received: KeyboardInterrupt | None = None
        self.previous: dict[int, object] = {}

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame):
        if self.received is not None:
            # A second Ctrl-C while the first unwinds would cut the clean-up short (a child
            # left running, a report half written); the first is already on its way, and
            # ``pending()`` hands it on again should it have been lost.
            return
        self.received = Terminated("terminated (SIGTERM)") if signum == signal.SIGTERM else KeyboardInterrupt()
        raise self.pending()

    def pending(self) -> KeyboardInterrupt | None:
        """A fresh copy of the interrupt received, if any (raised again where it was lost)."""
        return type(self.received)(*self.received.args) if self.received is not None else None


class JobFailed(RuntimeError):
    """The job failed; ``report`` is its failed report (cause, steps and history so far)."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


class _Backend:
    """Where a round's updates and signals go: in memory, or Redis (the job's own
    redis-server, started again if it dies, or the servers the spec names)."""

    def __init__(self, spec: JobSpec, stack: ExitStack, in_process: bool):
        self.spec, self.stack, self.in_process = spec, stack, in_process
        self.server: RedisServer | None = None
        self.urls: list[str] = list(spec.redis_urls)
        self.job = f"{spec.name}-{uuid.uuid4().hex[:6]}"
        self.updates: UpdateStore = MemoryUpdateStore() if in_process else self._redis()

    def _redis(self) -> UpdateStore:
        if not self.spec.redis_urls:
            self.server = self.stack.enter_context(_private_server())
            self.urls = [self.server.url]
        else:  # one that never answers fails here, within silent_server_bound_s, in one line
            for url in self.urls:
                _check_answers(url)
        updates = RedisUpdateStore(self.urls, self.job)
        self.stack.callback(updates.clear)
        return updates

    def renew(self, restart: int, store_lost: bool) -> str:
        """A fresh namespace for the round's next attempt (nothing of the lost one is read),
        after making sure the update store works again; says how it came back."""
        how = "its workers start again"
        if store_lost and self.server is not None and not self.server.answers():
            self.server.stop()  # dead, or dying (a SIGKILL is not reaped at once): never read again
            self.server = self.stack.enter_context(_private_server())
            self.urls = [self.server.url]
            how = f"the job's redis-server had died: a new one runs on {redact(self.server.url)}"
        elif store_lost:
            deadline, delay = time.monotonic() + STORE_RECONNECT_S, 0.1
            while True:
                try:
                    connect(self.urls[0]).ping()
                    break
                except redis.RedisError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(delay)
                    delay = min(2 * delay, 2.0)
            how = "the update store answered again"
        if not self.in_process:
            self.job = f"{self.job.split('~')[0]}~{restart}"
            self.updates = RedisUpdateStore(self.urls, self.job)
            self.stack.callback(self.updates.clear)
        return how

    def channel(self, round_: int, given) -> SignalChannel:
        if self.in_process:
            return given(round_) if callable(given) else given or MemorySignalChannel()
        return RedisSignalChannel(self.urls[0], self.job, round_)


STORE_RECONNECT_S = 30.0  # how long an external update store may take to come back


def _private_server() -> RedisServer:
    """The job's own redis-server, with a random password: another local user can reach a
    loopback port, not the job's state. The password travels inside the URL the workers are
    handed (never printed: ``redact``)."""
    return RedisServer(password=secrets.token_urlsafe(24))


def _check_answers(url: str) -> None:
    """One PING to a server the spec names: a refusal or silence is one line, before any work."""
    client = connect(url)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise EngineError(f"the update store {redact(url)} does not answer ({type(exc).__name__}: {exc})") from None
    finally:
        client.close()


def run_local(
    spec: JobSpec,
    sink: MetricsSink | None = None,
    *,
    resume: bool = False,
    policy=None,
    worker_cls: type[Worker] = Worker,
    in_process: bool | None = None,
    signals: SignalChannel | Callable[[int], SignalChannel] | None = None,
    measure_of: Callable | None = None,
    child_setup: Callable[[int], None] | None = None,
    pause_after: Callable[[dict], bool] | None = None,
    preflighted: bool = False,
) -> tuple[dict, dict[str, np.ndarray]]:
    """Run ``spec`` to completion here, round by round; returns (report, merged model).

    ``resume`` continues from the last complete round in ``OUT/checkpoints``. A round that
    loses a worker (under ``faults.on_worker_loss: restart_round``, or SSP) or its update
    store is run again from the last complete round, up to ``faults.max_restarts`` times.
    A failure raises ``JobFailed`` with the failed report. ``in_process`` runs the workers
    as threads over in-memory stores (default: only for a lone worker); ``policy``,
    ``worker_cls`` and ``signals`` let tests observe the engine (``signals``: one channel for
    every round, or ``signals(round)`` making each round's); ``measure_of(report)`` replaces
    what the fleet clock reads of a step (a ``WorkerStep``: replayed times, for reproducible runs).
    ``child_setup(worker_id)`` runs first in every worker process (``ProcessLauncher``; not
    with in-process workers). ``pause_after(result)``, asked after each unfinished round
    (``result``: the supervisor's ``{"steps", "round", ...}``), ends the call there when it says
    so: nothing is finalized and ``({"status": "paused", **result}, {})`` is returned; a later
    ``resume=True`` call continues from that round (``ebb tune`` promotes trials this way).
    """
    data = open_object_store(spec.data)
    out = open_object_store(spec.out_location)
    checkpoints = open_object_store(checkpoints_location(spec))
    if not resume:
        check_outputs(spec, out)
    if not preflighted:  # the caller checked this dataset against this job (``ebb train``)
        preflight(spec, data)  # PreflightError: nothing has run, nothing is written
    round_ = _first_round(spec, checkpoints, resume)
    if in_process is None:
        in_process = (
            spec.workers == 1 and not spec.redis_urls and spec.scaling.policy != "schedule" and child_setup is None
        )
    title = getproctitle()
    supervisor: Supervisor | None = None
    try:
        with ExitStack() as stack:
            stack.callback(setproctitle, title)
            setproctitle(f"ebb supervisor {spec.name}")
            stops = _StopSignals()
            if threading.current_thread() is threading.main_thread():
                # A SIGTERM would otherwise skip the clean-up below and orphan the workers and
                # the redis-server (which runs in its own session).
                stops.install()
                stack.callback(stops.restore)
            backend = _Backend(spec, stack, in_process)
            done = checkpoint.latest(checkpoints)
            finished = done is not None and done["finished"]
            restarts, faults = 0, []  # faults: this round's earlier attempts, for its report
            while not finished:
                if (interrupt := stops.pending()) is not None:
                    raise interrupt
                channel = backend.channel(round_, signals)
                if in_process:
                    launcher = ThreadLauncher(
                        spec,
                        data=data,
                        checkpoints=checkpoints,
                        updates=backend.updates,
                        signals=channel,
                        worker_cls=worker_cls,
                    )
                else:
                    launcher = ProcessLauncher(spec, backend.urls, backend.job, child_setup)
                attempt_started = time.monotonic()
                try:
                    supervisor = Supervisor(
                        spec,
                        data=data,
                        checkpoints=checkpoints,
                        updates=backend.updates,
                        signals=channel,
                        launcher=launcher,
                        round_=round_,
                        sink=sink,
                        policy=policy,
                        restarts=faults,
                        measure_of=measure_of,
                        interrupted=stops.pending,
                    )
                    result = supervisor.run_round()
                except (RoundLost, redis.ConnectionError, redis.TimeoutError) as exc:
                    launcher.stop_all()
                    store_lost = not isinstance(exc, RoundLost)
                    reason = f"the update store was lost ({exc})" if store_lost else str(exc)
                    restarts += 1
                    if restarts > spec.faults.max_restarts:
                        raise EngineError(
                            f"{reason}; rounds were restarted {spec.faults.max_restarts} times "
                            "already (faults.max_restarts)"
                        ) from None
                    attempt_s = time.monotonic() - attempt_started  # paid for, then thrown away
                    members = len(supervisor.state.members) if supervisor is not None else spec.workers
                    how = backend.renew(restarts, store_lost)
                    faults = faults + [
                        {
                            "round": round_,
                            "restart": restarts,
                            "reason": reason,
                            "recovery": f"{how}; the round ran again from its checkpoints",
                            "attempt_seconds": round(attempt_s, 3),
                            "workers": members,
                        }
                    ]
                    continue
                finally:
                    launcher.stop_all()
                faults = []
                finished = result["status"] == "finished"
                round_ += 1
                if not finished and pause_after is not None and pause_after(result):
                    return {**result, "status": "paused"}, {}
    except (Exception, KeyboardInterrupt) as exc:
        message = str(exc) or "interrupted (Ctrl-C)"
        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
            message = f"the update store was lost ({exc}) and did not come back"
        report = {"status": "failed", "error": message} if supervisor is None else supervisor.failure_report(message)
        raise JobFailed(message, report) from exc
    report, replica = finalize(spec, data=data, checkpoints=checkpoints, out=out)
    if sink is not None:
        sink.close(report)
    return report, replica


def _first_round(spec: JobSpec, checkpoints: ObjectStore, resume: bool) -> int:
    """The round to run first: after the last complete one when resuming, else 0 (and the
    checkpoints of an earlier run in the same place are cleared). A job resumed before its
    first round completed starts from the beginning: nothing of it was kept."""
    done = checkpoint.latest(checkpoints)
    if resume and done is not None:
        return done["round"] + 1
    for key in checkpoints.list():
        checkpoints.delete(key)
    # The dataset by its absolute path: `ebb train --resume OUT` works from any directory.
    stored = spec if is_s3(spec.data) else spec.model_copy(update={"data": os.path.abspath(spec.data)})
    checkpoints.put(SPEC_KEY, stored.model_dump_json(indent=2).encode())
    return 0
