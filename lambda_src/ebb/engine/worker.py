"""The worker loop (docs/ARCHITECTURE.md, "A job" and "Synchronisation"; MLLess §3).

At step t a worker: fetches its minibatch → computes a local update → runs the
significance filter (ISP) → publishes what is significant → announces the step (or
announces it *empty*) → waits until the supervisor's clock allows it to go on → pulls
the other workers' updates of every cleared step and applies them → acts on the
supervisor's directive (continue, evict, join, stop).

* BSP / ISP: the clock must reach t itself (a barrier). A worker's own update is applied
  at the barrier together with the others', in worker-id order, so every replica adds
  the same numbers in the same order: ISP with v = 0 is BSP bit for bit.
* SSP with slack s: the worker applies its own update at once and may start step t+1
  while the slowest worker has finished step ≥ t − s; it applies everyone's update of a
  step as soon as the step is cleared.

A worker runs for one *round* (docs/ARCHITECTURE.md, "Rounds and checkpoints"). When a
directive names the round's last step R, the worker trains no step past R; once R is
applied it writes its checkpoint — replica, optimiser state, ISP accumulators, loop
counters — and ends "unfinished". The next round's worker (a fresh process, or a fresh
Lambda invocation) resumes from it.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time

from ebb.data.format import decode_batch, encode_batch
from ebb.engine import checkpoint
from ebb.engine.aggregate import RowMean
from ebb.engine.cadence import eval_interval, learning_rate
from ebb.engine.clock import wall
from ebb.engine.errors import CheckpointError, EngineError
from ebb.engine.isp import SignificanceFilter
from ebb.engine.parts import PartCache, prime_for_scoring
from ebb.engine.pauses import PauseClock
from ebb.engine.replica import copy_replica, load_state_arrays, state_arrays
from ebb.engine.stopping import improved
from ebb.engine.striping import PartSequence, position_of
from ebb.engine.timer import StepTimer
from ebb.models import Model, build_model
from ebb.ports.keys import (
    ABORT_BLOB,
    BEST_META_KEY,
    BEST_REPLICA_KEY,
    SUPERVISOR_SLOT,
    lost_blob,
    replica_blob,
    worker_key,
)
from ebb.ports.launcher import WorkerStart
from ebb.ports.manifest import load_manifest
from ebb.ports.messages import Directive, EndReport, Scoring, StepReport
from ebb.ports.objects import ObjectStore
from ebb.ports.signals import SignalChannel
from ebb.ports.updates import UpdateStore
from ebb.sparse import RowUpdate
from ebb.spec import JobSpec

BLOB_WAIT_S = 120.0  # how long to wait for a peer's replica before calling the job broken
DIRECTIVE_WAIT_S = 600.0  # a supervisor silent this long is gone
WAIT_CHUNK_S = 1.0  # longest single blocking read: between them a worker notices it was cancelled
HEARTBEAT_S = 1.0


def start_worker(
    spec: JobSpec,
    start: WorkerStart,
    *,
    data: ObjectStore,
    checkpoints: ObjectStore,
    updates: UpdateStore,
    signals: SignalChannel,
    worker_cls: type[Worker] | None = None,
) -> Worker:
    """A worker, built; one that cannot start (a corrupt checkpoint, an unreadable dataset)
    tells the supervisor why, in one line, before the error is raised: the job fails with
    that message instead of losing the worker to an unexplained exit code."""
    try:
        return (worker_cls or Worker)(spec, start, data=data, checkpoints=checkpoints, updates=updates, signals=signals)
    except Exception as exc:
        error = " ".join(f"could not start: {type(exc).__name__}: {exc}".split())[:500]
        with contextlib.suppress(Exception):  # the channel itself may be what failed
            signals.report(
                EndReport(worker=start.worker, step=start.step - 1, round=start.round, outcome="failed", error=error)
            )
        raise


class Lost(Exception):
    """The supervisor has given up on this worker (it stalled too long): leave quietly."""


class Worker:
    """One worker of one round: trains until the supervisor stops it, evicts it or ends the round."""

    def __init__(
        self,
        spec: JobSpec,
        start: WorkerStart,
        *,
        data: ObjectStore,
        checkpoints: ObjectStore,
        updates: UpdateStore,
        signals: SignalChannel,
        model: Model | None = None,
    ):
        self.spec, self.me, self.round = spec, start.worker, start.round
        self.data, self.checkpoints, self.updates, self.signals = data, checkpoints, updates, signals
        self.manifest = load_manifest(data, spec.data)
        self.model = model or build_model(spec.model, self.manifest, spec.hyper, spec.seed)
        self.parts = PartCache(data, self.manifest, self.model, max_bytes=spec.aws.part_cache_bytes())
        self.sequence = PartSequence(len(self.manifest.train.parts), spec.seed)
        self.mode = spec.effective_sync_mode
        self.slack = spec.sync.slack if self.mode == "ssp" else 0
        significance, combine = spec.sync.significance, spec.sync.combine
        assert significance is not None and combine is not None  # the spec fills them from the model catalogue
        self.filter = (
            SignificanceFilter(self.model.params, significance, spec.sync.quantize) if self.mode == "isp" else None
        )
        self.row_mean = RowMean(self.model.params, combine, spec.sync.sum_cap)
        self.members, self.step, self.cursor = sorted(start.members), start.step, start.cursor
        self.base_lr = self.model.optimizer.lr
        # A held-out scoring not reported yet: one made at a round's last step travels in the
        # checkpoint, and goes with the next round's first report, as it would without the cut.
        self._scoring: Scoring | None = None
        if start.resume:
            self._restore(start.resume)
        self.clock = self.step - 1  # every step before ours is cleared
        self.applied_upto = self.step - 1
        self.round_end: int | None = None  # the round's last step, once a directive names it
        self.own: dict[int, RowUpdate] = {}  # own updates awaiting their barrier (BSP / ISP)
        self.events: dict[int, Directive] = {}  # directives by step
        self.timer = StepTimer()
        self.bytes_read = 0
        self.requests = 0  # update-store round trips since the last report (the fleet clock's rtt term)
        self.io_cpu = 0.0  # CPU inside the update store's calls since the last report (overlaps the wire)
        self._cpu_mark = time.process_time()
        self.sync_overhead_s: float | None = None
        self._announce_s = 0.0
        self._next_members: list[int] | None = None
        self._held_out: PartCache | None = None
        self._eval_every = eval_interval(spec, self.manifest)
        self._best: float | None = None
        self.cancelled = threading.Event()  # set by an in-process launcher tearing the job down
        self.pauses = PauseClock()  # the supervisor's heartbeat is judged on our running time
        self._round_started = wall()  # reset by run(): when this invocation began its round
        if start.donor_blob:
            self._adopt_replica(start.donor_blob)

    # -- checkpoints ---------------------------------------------------------------
    def _restore(self, key: str) -> None:
        meta, arrays = checkpoint.read_worker(self.checkpoints, key)
        if meta["worker"] != self.me or meta["job"] != self.spec.name or meta["model"] != self.spec.model:
            raise CheckpointError(
                f"checkpoint {key} belongs to worker {meta['worker']} of job {meta['job']} ({meta['model']}), "
                f"not to worker {self.me} of job {self.spec.name} ({self.spec.model})"
            )
        if meta["mode"] != self.mode:
            raise CheckpointError(
                f"worker {self.me}'s checkpoint was written under sync mode {meta['mode']} but the job now runs "
                f"{self.mode}; resume with the spec the job started with"
            )
        load_state_arrays(self.model, self.filter, arrays)
        self.step, self.cursor, self.members = meta["step"], meta["cursor"], sorted(meta["members"])
        if meta.get("scoring") is not None:
            self._scoring = Scoring.model_validate(meta["scoring"])

    def _write_checkpoint(self, outcome: str) -> str:
        key = worker_key(self.round, self.me)
        arrays = state_arrays(self.model, self.filter)
        meta = {
            "worker": self.me,
            "job": self.spec.name,
            "model": self.spec.model,
            "mode": self.mode,
            "round": self.round,
            "step": self.step,
            "cursor": self.cursor,
            "members": self.members,
            "applied_upto": self.applied_upto,
            "outcome": outcome,
            "scoring": self._scoring.model_dump(mode="json") if self._scoring is not None else None,
        }
        checkpoint.write_worker(self.checkpoints, key, meta, arrays)
        return key

    def _end(self, outcome: str, key: str | None = None, error: str | None = None) -> str:
        cpu, self._cpu_mark = time.process_time() - self._cpu_mark, time.process_time()
        self.signals.report(
            EndReport(
                worker=self.me,
                step=self.applied_upto,
                round=self.round,
                outcome=outcome,
                checkpoint=key,
                error=error,
                read_bytes=self.bytes_read,
                cpu_seconds=cpu,
                object_gets=self.parts.gets,
                timing=self.timer.take(),
                cpu_timing=self.timer.take_cpu(),
                pending_nnz=self.filter.pending_nnz() if self.filter and outcome == "evicted" else 0,
            )
        )
        return outcome

    # -- helpers -------------------------------------------------------------------
    def _wait_blob(self, name: str) -> bytes:
        deadline = time.monotonic() + BLOB_WAIT_S
        while (blob := self.updates.get_blob(name)) is None:
            if time.monotonic() > deadline:
                raise EngineError(f"worker {self.me}: replica {name!r} never arrived")
            time.sleep(0.002)
        return blob

    def _adopt_replica(self, name: str) -> None:
        copy_replica(self.model, decode_batch(self._wait_blob(name)))

    def _set_lr(self) -> None:
        self.model.optimizer.lr = learning_rate(
            self.spec, self.base_lr, self.step, len(self.members), self.sequence.num_parts
        )

    def _receive(self, directive: Directive) -> None:
        if directive.step <= self.applied_upto:
            return  # delivered twice (at-least-once channels): applied already
        self.events[directive.step] = directive
        self.clock = max(self.clock, directive.step)
        if directive.round_end is not None:
            self.round_end = directive.round_end
        if directive.last_sent_at is not None and directive.step == self.step:
            self.sync_overhead_s = self._announce_s + max(0.0, wall() - directive.last_sent_at)

    # -- the loop ------------------------------------------------------------------
    def run(self) -> str:
        """Train until the supervisor says stop (→ "stopped"), evicts us (→ "evicted") or
        ends the round (→ "unfinished", after writing the checkpoint). A failure is reported
        to the supervisor (its message, one line) before it is raised."""
        self._round_started = wall()
        beating = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(beating,), name=f"ebb-heartbeat-{self.me}", daemon=True)
        beat.start()
        self.pauses.start()
        try:
            return self._run()
        except Lost:
            return "evicted"
        except Exception as exc:
            try:
                self._end("failed", error=f"{type(exc).__name__}: {exc}")
            except Exception:  # the channel itself may be what failed
                pass
            raise
        finally:
            beating.set()
            self.pauses.stop()
            beat.join(timeout=5)  # not left running into interpreter shutdown

    def _heartbeat(self, stopped: threading.Event) -> None:
        """Tell the supervisor we are alive, every second, whatever the training loop does."""
        while not stopped.is_set():
            try:
                self.updates.heartbeat(self.me, wall())
            except Exception:  # the main loop meets the same store and reports it
                pass
            stopped.wait(HEARTBEAT_S)

    def _run(self) -> str:
        while True:
            end = self.round_end
            training = end is None or self.step <= end
            if end is None or self.step <= end:
                self._compute_and_publish()
                self._wait_for_clock(self.step - self.slack)
            else:  # the round's last step is trained: wait until everyone's is applied
                self._wait_for_clock(end)
            outcome = self._apply_cleared(advance=training)
            if outcome:
                return outcome
            if self.round_end is not None and self.applied_upto >= self.round_end:
                return self._end("unfinished", self._write_checkpoint("unfinished"))

    def _compute_and_publish(self) -> None:
        t = self.step
        self.timer.start()
        position = position_of(self.cursor, self.members, self.me)
        self._set_lr()
        batch = self.parts.get(self.sequence.part_at(position))
        self.timer.lap("fetch")
        loss_sum, samples, update = self.model.local_update(batch)
        self.timer.lap("compute")
        sent = self.filter(update, self.model.params, t) if self.filter else update
        self.timer.lap("filter")
        empty = sent.is_empty()
        if len(self.members) == 1:
            payload = b""  # alone: nobody to read it
        elif self.filter:
            # ISP ships the significant entries plus the rows it touched, so every reader
            # divides each row by the same toucher count BSP would (see engine.aggregate).
            payload = sent.encode()
        else:
            payload = b"" if empty else sent.encode()
        if payload:
            io_mark = time.process_time()
            self.updates.publish(t, self.me, payload)
            self.io_cpu += time.process_time() - io_mark
            self.requests += 1
        self.timer.lap("write")
        if self.mode == "ssp":
            self.model.apply(update)  # read your own writes; corrected to the step's mean when it clears
        self.own[t] = update
        self.timer.lap("apply")
        before = time.perf_counter()
        cpu, self._cpu_mark = time.process_time() - self._cpu_mark, time.process_time()
        self.signals.report(
            StepReport(
                worker=self.me,
                step=t,
                members=self.members,
                round=self.round,
                loss_sum=loss_sum,
                samples=samples,
                empty=empty,
                sent_bytes=len(payload),
                sent_nnz=sent.nnz(),
                local_nnz=update.nnz(),
                read_bytes=self.bytes_read,
                applied_upto=self.applied_upto,
                position=position,
                cpu_seconds=cpu,
                io_cpu_seconds=self.io_cpu,
                sync_seconds=self.sync_overhead_s,
                sent_at=wall(),
                object_gets=self.parts.gets,
                requests=self.requests + 2,  # this announcement and the go that answers it
                timing=self.timer.take(),
                cpu_timing=self.timer.take_cpu(),
                scoring=self._scoring,
            )
        )
        self.parts.gets = 0
        self._scoring = None
        self._announce_s = time.perf_counter() - before
        self.bytes_read, self.sync_overhead_s, self.requests, self.io_cpu = 0, None, 0, 0.0

    def _wait_for_clock(self, need: int) -> None:
        self.timer.start()
        # Under SSP directives pile up while we compute; under a barrier ours cannot be there yet.
        while self.slack and (d := self.signals.next_directive(self.me, 0)) is not None:
            self._receive(d)
        started, since = time.monotonic(), wall()
        deadline = started + DIRECTIVE_WAIT_S
        while self.clock < need:
            d = self.signals.next_directive(self.me, min(WAIT_CHUNK_S, max(0.001, deadline - time.monotonic())))
            if d is not None:
                self._receive(d)
            elif self.cancelled.is_set():
                raise EngineError(f"worker {self.me}: cancelled")
            elif self.pauses.age(since) > self.spec.faults.worker_timeout_s:
                self._check_still_wanted(need)
            elif time.monotonic() > deadline:
                raise EngineError(
                    f"worker {self.me}: no word from the supervisor for {DIRECTIVE_WAIT_S:.0f} s "
                    f"(waiting for step {need}'s directive)"
                )
        self.timer.lap("wait")

    def _check_still_wanted(self, need: int) -> None:
        """After a long wait: leave if the supervisor gave up on us, fail if it went silent
        for longer than its deadline (``faults.supervisor_timeout_s``; time we were paused
        ourselves does not count: ``ebb.engine.pauses``)."""
        if self.updates.get_blob(lost_blob(self.me)) is not None:
            raise Lost()
        if (why := self.updates.get_blob(ABORT_BLOB)) is not None:
            raise EngineError(f"worker {self.me}: the supervisor gave the round up ({why.decode(errors='replace')})")
        faults = self.spec.faults
        beat = self.updates.heartbeats([SUPERVISOR_SLOT]).get(SUPERVISOR_SLOT)
        # A beat from before this round began is the previous round's supervisor: this round's
        # may still be starting (a cold start), so it gets the start-up allowance, not the beat's.
        if beat is None or beat < self._round_started:
            silent = self.pauses.age(self._round_started)
            allowed = max(faults.startup_timeout_s, faults.supervisor_timeout_s)
        else:
            silent, allowed = self.pauses.age(beat), faults.supervisor_timeout_s
        if silent > allowed:
            raise EngineError(
                f"worker {self.me}: the supervisor went silent (nothing for {silent:.0f} s) while "
                f"this worker waited for step {need}'s directive"
            )

    def _apply_cleared(self, advance: bool) -> str | None:
        """Apply every cleared step; with ``advance``, our own step is done: move on."""
        for k in range(self.applied_upto + 1, self.clock + 1):
            members = self.members
            directive = self.events.pop(k, None)
            senders = directive.senders if directive is not None else None
            # The directive names who sent something: empty announcers are not read at all.
            others = [q for q in members if q != self.me and (senders is None or q in senders)]
            io_mark = time.process_time()
            payloads = self.updates.fetch(k, others) if others else {}
            self.io_cpu += time.process_time() - io_mark
            self.requests += bool(others)
            self.bytes_read += sum(len(p) for p in payloads.values())
            self.timer.lap("read")
            own = self.own.pop(k, None)
            # Worker-id order, own update in its slot: every replica adds the same numbers.
            # The payloads go in encoded: the compiled kernel decodes and adds them all in one call.
            sources: list[bytes | RowUpdate] = []
            for q in members:
                if q == self.me and own is not None:
                    sources.append(own)
                elif q in payloads:
                    sources.append(payloads[q])
            self.row_mean.apply_wire(self.model.params, sources)
            if self.mode == "ssp" and own is not None:
                self.model.apply(own, scale=-1.0)  # it was applied at once; the mean replaces it
            self.timer.lap("apply")
            self.applied_upto = k
            self._maybe_evaluate(k)
            outcome = self._act_on(directive, k) if directive is not None else None
            if outcome:
                return outcome
        if advance:
            # The step is done: the cursor moves on by the members that trained it.
            self.cursor += len(self.members)
            self.step += 1
            if self._next_members is not None:
                self.members, self._next_members = self._next_members, None
        return None

    def _maybe_evaluate(self, k: int) -> None:
        """Every ``eval_interval`` steps the lowest-id worker scores its replica on the held-out
        split; on validation it keeps the best replica so far (the model early stopping writes)."""
        every = self._eval_every
        split = self.manifest.held_out_split
        if not every or (k + 1) % every or self.me != self.members[0] or not self.manifest.split(split).parts:
            return
        started, cpu = time.perf_counter(), time.process_time()
        if self._held_out is None:
            self._held_out = PartCache(
                self.data, self.manifest, self.model, split=split, max_bytes=self.spec.aws.part_cache_bytes()
            )
            prime_for_scoring(self.data, self.manifest, self.model)
        metrics = self.model.evaluate(self._held_out.each())
        epoch = (self.cursor + len(self.members)) / self.sequence.num_parts
        if split == "val":
            self._keep_if_best(k, epoch, metrics[self.model.loss_name])
        self._scoring = Scoring(
            step=k, split=split, epoch=round(epoch, 4), metrics=metrics, seconds=time.perf_counter() - started
        )
        self._cpu_mark += time.process_time() - cpu  # scoring is not training: kept out of cpu_seconds

    def _keep_if_best(self, k: int, epoch: float, value: float) -> None:
        if self._best is None:  # the best so far of the job, whichever worker scored it
            try:
                self._best = json.loads(self.checkpoints.get(BEST_META_KEY))["value"]
            except KeyError:
                self._best = math.inf
        if improved(value, self._best, self.spec.stop.min_delta):
            self._best = value
            self.checkpoints.put(BEST_REPLICA_KEY, encode_batch(self.model.replica_arrays()))
            self.checkpoints.put(
                BEST_META_KEY,
                json.dumps(
                    {"step": k, "epoch": round(epoch, 4), "value": value, "metric": self.model.loss_name}
                ).encode(),
            )

    def _act_on(self, directive: Directive, k: int) -> str | None:
        """Membership changes and stop, taken at the barrier after step k is applied."""
        if directive.stop:
            return self._end("stopped", self._write_checkpoint("stopped"))
        evicted = directive.evict
        if self.me in evicted or self.me in directive.donors:
            self.updates.put_blob(replica_blob(self.me, k), encode_batch(self.model.replica_arrays()))
        if self.me in evicted:
            return self._end("evicted")
        for q in evicted:
            # MLLess §4.2: fold the leaver's replica in, so its unsent updates are not lost.
            self.model.average_in(decode_batch(self._wait_blob(replica_blob(q, k))))
        if directive.members is not None:
            self._next_members = sorted(directive.members)
        return None
