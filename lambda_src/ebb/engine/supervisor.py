"""The supervisor: one round of a job's control loop (docs/ARCHITECTURE.md, "A job",
"The protocol" and "Rounds and checkpoints").

It never touches a worker's data path: it reads small reports and writes one directive
per step (go on / evict / join / stop / end of round). Steps are *closed* in order; the
directive of step k is what lets BSP and ISP workers go past their barrier, and what
tells SSP workers how far the slowest one is.

The supervisor is not on the barrier's critical path. While step k+1 runs it closes
step k and hands the signal channel the directive of step k+1, which the channel
delivers the moment the last worker announces step k+1 (inside Redis, in one script).
So a decision taken on step k's loss takes effect at barrier k+1, and membership changes
from step k+2. Should the supervisor fall behind, the channel delivers the directive when
it arrives instead: slower, never different.

The loop only sequences; the decisions are elsewhere: the stop rules and the best
scoring in ``stopping``, lost workers in ``failures``, scaling in ``scaling`` (and the
policies of ``ebb.autotune``), the round's end in ``rounds``, the counters in
``accounting``. What it knows lives in one typed ``SupervisorState`` (``state``): a round
saves it, the next round — a fresh supervisor and fresh workers — starts from it.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from ebb.autotune.policies import ScalingPolicy, StepSeen
from ebb.catalogue import entry
from ebb.engine import accounting, checkpoint, failures, finalize, rounds, scaling, stopping
from ebb.engine.cadence import eval_interval
from ebb.engine.clock import JobTime, wall
from ebb.engine.errors import EngineError
from ebb.engine.fleet_clock import WorkerStep, peer_seconds
from ebb.engine.inbox import Inbox
from ebb.engine.pauses import PauseClock
from ebb.engine.state import SupervisorState
from ebb.models import loss_value
from ebb.ports.keys import ABORT_BLOB, SUPERVISOR_SLOT
from ebb.ports.launcher import WorkerLauncher, WorkerStart
from ebb.ports.manifest import load_manifest
from ebb.ports.messages import Directive, EndReport, Report, StepReport
from ebb.ports.metrics import MetricsSink, NullSink
from ebb.ports.objects import ObjectStore
from ebb.ports.signals import SignalChannel
from ebb.ports.updates import UpdateStore
from ebb.spec import JobSpec

REPORT_POLL_S = 0.5


LAST_WORD_S = 0.2  # how long to listen for a lost worker's last report before giving up on it


class Supervisor:
    """One round of a job's control loop, started from the state the last round saved."""

    def __init__(
        self,
        spec: JobSpec,
        *,
        data: ObjectStore,
        checkpoints: ObjectStore,
        updates: UpdateStore,
        signals: SignalChannel,
        launcher: WorkerLauncher,
        round_: int,
        sink: MetricsSink | None = None,
        policy: ScalingPolicy | None = None,
        round_seconds: float | None = None,
        restarts: list[dict[str, Any]] | None = None,
        measure_of: Callable[[StepReport], WorkerStep] | None = None,
        interrupted: Callable[[], BaseException | None] | None = None,
    ):
        self.spec, self.data, self.checkpoints = spec, data, checkpoints
        self.updates, self.signals, self.launcher = updates, signals, launcher
        self.interrupted = interrupted  # the caller's stop request (a Ctrl-C), asked every poll
        self.sink = sink or NullSink()
        self.policy = policy if policy is not None else scaling.policy_for(spec)
        self.manifest = load_manifest(data, spec.data)
        self.num_parts, self.loss_name = len(self.manifest.train.parts), entry(spec.model).loss_name
        self._loss = partial(loss_value, self.loss_name)
        self._watching_val = self.manifest.has_val and eval_interval(spec, self.manifest) > 0
        self.round, self.round_seconds = round_, min(spec.round_seconds, round_seconds or math.inf)
        s = self.state = (
            checkpoint.read_supervisor(checkpoints, round_ - 1) if round_ else SupervisorState.initial(spec)
        )
        s.check_resumes(spec, round_)
        if s.policy is not None:
            self.policy.load_state_dict(s.policy)
        s.faults += restarts or []  # earlier attempts at this round that were given up
        slack = spec.sync.slack if s.mode == "ssp" else 0
        self.time = JobTime(spec, host_before=s.host_elapsed, fleet_before=s.fleet, slack=slack)
        self.measure_of = measure_of or WorkerStep.of  # a worker's step as the fleet clock reads it
        self.round_end_rule = rounds.RoundEnd(
            round_seconds=self.round_seconds, round_steps=spec.round_steps, first_step=s.clock + 1, slack=slack
        )
        self.inbox = Inbox(discarded_upto=self.state.clock)  # this round's reports, starts and ends
        self.books = accounting.Books(spec, s, self.time, self.inbox, round_)
        self.round_end: int | None = None  # the round's last step, once named
        self._new_val: float | None = None  # a held-out scoring not yet shown to the sink
        self._early: dict[int, tuple[str, float]] = {}  # scorings of steps not closed yet
        self._staged: dict[int, Directive] = {}  # released directives of steps not yet closed
        self._last_progress = 0.0  # round time of the last closed step: how long we have waited
        # Heartbeats and waits are judged on our running time: after the whole job was
        # suspended, nobody's heartbeat is stale for the time we were not looking.
        self.pauses = PauseClock()

    def snapshot(self) -> SupervisorState:
        """The state as of now, with this round's time, money and measurements folded in."""
        return self.books.snapshot(policy=self.policy.state_dict(), autotune=scaling.autotune_summary(self.policy))

    # -- the round -----------------------------------------------------------------
    def run_round(self) -> dict[str, Any]:
        """Run this round to its end: ``{"status": "finished" | "unfinished", ...}``."""
        if self.state.finished:
            raise EngineError(f"job {self.spec.name} has finished already (round {self.state.round})")
        self.pauses.start()
        try:
            self._start_workers()
            while not self._round_over():
                self._poll()
        except Exception as exc:
            # The workers still waiting at a barrier leave instead of waiting out their
            # timeouts (unless the update store is what failed).
            with contextlib.suppress(Exception):
                self.updates.put_blob(ABORT_BLOB, str(exc)[:500].encode())
            raise
        finally:
            self.pauses.stop()
        return self._save()

    def _poll(self) -> None:
        if self.interrupted is not None and (stop := self.interrupted()) is not None:
            raise stop
        self.updates.heartbeat(SUPERVISOR_SLOT, wall())  # workers waiting long look for it
        reports = self.signals.next_reports(REPORT_POLL_S)
        busy = time.perf_counter()
        for r in reports:
            self._take(r)
        closed = 0
        while self.inbox.complete(self.state.clock + 1, self.state.members) and not self._last_step_closed():
            self._close_step(self.state.clock + 1)
            closed += 1
        if closed:  # the supervisor's own time per step: reading reports, closing, deciding
            self.state.overheads.handling_ms += [round(1000 * (time.perf_counter() - busy) / closed, 4)] * closed
            self.updates.heartbeat(SUPERVISOR_SLOT, wall())  # scoring and the tuner's fits take a while
        if not reports:
            self._check_liveness()
            waiting = self.state.clock + 1
            if why := failures.overdue(
                self.round,
                self._running(0.0),
                self.round_seconds,
                waiting,
                self.inbox.missing(waiting, self.state.members),
            ):
                raise EngineError(why)

    def _start_workers(self) -> None:
        s = self.state
        held, s.held = s.held, None
        assert held is not None, "a round starts from the directive the last one held"
        self._release(held.step, s.members, held.model_copy(update={"round": self.round}))
        if self.time.fleet:
            self.time.fleet.launch(s.members)  # the round's wave of invocations: one cold start
        for start in rounds.round_starts(s, self.round):
            self._launch(start)

    def _launch(self, start: WorkerStart) -> None:
        self.inbox.started_at[start.worker] = self.time.elapsed()
        self.state.worker_invocations += 1
        self.launcher.launch(start)

    def _last_step_closed(self) -> bool:
        s = self.state
        return rounds.last_step_closed(s.clock, s.stop.step if s.stop.reason else None, self.round_end)

    def _round_over(self) -> bool:
        return self._last_step_closed() and all(w in self.inbox.ended for w in self.state.members)

    def _release(self, step: int, trainers: list[int], directive: Directive) -> None:
        self.state.directives += 1
        self._staged[step] = directive
        if self.signals.release(step, trainers, directive):
            self.state.overheads.released_late += 1

    # -- what the workers say --------------------------------------------------------
    def _take(self, r: Report) -> None:
        s = self.state
        if isinstance(r, EndReport):
            if r.outcome == "failed" and r.worker not in self.inbox.ended:
                when = f"after step {r.step}" if r.step >= 0 else "before its first step"
                raise EngineError(f"worker {r.worker} failed {when}: {r.error}")
            if self.inbox.take_end(r, at=self.time.elapsed()):  # (a step's reports count when it closes)
                accounting.count_report(s.totals, s.timing, r, s.cpu_timing)
                s.checkpoint_puts += 1 if r.checkpoint else 0
            return
        if not self.inbox.take_step(r, closed_upto=s.clock):
            return
        if r.scoring:
            self._new_val = r.scoring.metrics[self.loss_name]
            now, fleet = self.time.elapsed(), self.time.fleet is not None
            if (early := stopping.take_scoring(s, self.spec, r.scoring, now=now, fleet_clock=fleet)) is not None:
                self._early[r.scoring.step] = early
        if r.sync_seconds is not None:
            s.overheads.sync_samples.append(round(r.sync_seconds, 6))

    # -- closing a step --------------------------------------------------------------
    def _close_step(self, k: int) -> None:
        s = self.state
        reports = self.inbox.close(k, s.members)
        self._staged.pop(k, None)
        self._last_progress = self.time.host.round_elapsed()
        trained = list(s.members)
        step = accounting.close_step(s, reports, num_parts=self.num_parts, loss_of=self._loss)
        measured = {w: self.measure_of(r) for w, r in reports.items()}
        if self.time.fleet:
            joining = len(set(s.upcoming) - set(s.members))  # launched, not training yet: billed
            self.time.fleet.close(k, measured, waiting=joining)
        elapsed = self.time.elapsed()
        self.round_end_rule.step_closed(self.time.host.round_elapsed())
        stopping.check_finite(k, step.loss, reports, epoch=step.epoch, lr=self.spec.hyper.lr, loss_of=self._loss)
        accounting.track_recent_loss(s.recent_loss, reports, self._loss)
        cost = self.books.cost()["total_usd"]
        record = accounting.history_entry(
            k,
            step,
            time=elapsed,
            host_time=self.time.host.elapsed(),
            workers=len(trained),
            round_=self.round,
            cost_usd=cost,
        )
        if (early := self._early.pop(k, None)) is not None:
            record[early[0]] = early[1]
            record["eval_seconds_total"] = round(s.overheads.eval_seconds, 4)
        s.history.append(record)
        self.inbox.senders[k] = sorted(w for w, r in reports.items() if r.sent_bytes)
        if s.stop.reason is None:
            self._decide_next(k, step.loss, step.epoch, elapsed, cost, self._peer_seconds(reports, measured))
        else:
            s.members = s.upcoming
        watch = stopping.watch(
            s.stop,
            self.spec,
            scoring_val=self._watching_val,
            epoch=step.epoch,
            epoch_limit=self.spec.epoch_limit(self.manifest.has_val),
            elapsed=elapsed,
            cost_usd=cost,
        )
        self.sink.step(
            {
                **record,
                "active": len(s.members),
                "stop": s.stop.reason,
                "timing": accounting.mean_timing(reports),
                "val": self._new_val,
                "best_val": s.stop.best.value if s.stop.best else None,
                "watch": watch.as_dict(),
            }
        )
        self._new_val = None
        s.clock = k
        # Every worker has applied the steps up to min(applied): their updates can go.
        self.inbox.discard_upto(min(r.applied_upto for r in reports.values()), self.updates)

    def _peer_seconds(self, reports: dict[int, StepReport], measured: dict[int, WorkerStep]) -> float:
        """The part of the step the workers spent reading and applying their peers' updates,
        on the job's clock (the cost guard's step-time model, ``ebb.autotune.tuner``)."""
        if self.time.fleet:
            return peer_seconds(measured.values(), self.time.fleet.links)
        # A worker's "apply" phase adds the step's mean, its own update one of P in it.
        own = 1.0 / max(1, len(reports))
        spent = [r.timing.get("read", 0.0) + r.timing.get("apply", 0.0) * (1.0 - own) for r in reports.values()]
        return sum(spent) / max(1, len(spent))

    def _decide_next(
        self, k: int, loss: float, epoch: float, elapsed: float, cost_usd: float, peer_s: float | None = None
    ) -> None:
        """Write step k+1's directive from what step k showed (stop, evict, join, end of round)."""
        s, nxt = self.state, k + 1
        trainers = s.upcoming  # who trains step k+1 and hears its directive
        # Epochs after step k+1, so max_epochs stops where it did when decisions were immediate.
        epoch_next = (s.cursor + len(trainers)) / self.num_parts
        s.stop.reason = stopping.stop_reason(
            s.stop,
            self.spec,
            loss=loss,
            epoch_next=epoch_next,
            epoch_limit=self.spec.epoch_limit(self.manifest.has_val),
            elapsed=elapsed,
            cost_usd=cost_usd,
            step=k,
        )
        steps_left = stopping.steps_to_target(s, self.spec, k)
        self.policy.observe(StepSeen(k, elapsed, loss, len(s.members), epoch, peer_s, steps_left))
        directive = Directive(step=nxt, round=self.round, stop=bool(s.stop.reason))
        if s.stop.reason:
            s.stop.step = nxt
        if self.round_end is not None and k >= self.round_end:
            # The round's last step is closed: this directive (a stop too) opens the next round's first step.
            s.held, s.members, s.upcoming = directive, trainers, list(trainers)
            return
        after = list(trainers)
        if not s.stop.reason:
            if self.round_end is None:
                self.round_end = self.round_end_rule.last_step(nxt, s.clock, self.time.host.round_elapsed())
            if self.round_end is None:  # (no scaling while a round winds down)
                after = self._scale(k, elapsed, trainers, directive, epoch)
            directive.round_end = self.round_end
        self._release(nxt, trainers, directive)
        s.members, s.upcoming = trainers, after

    def _scale(self, k: int, elapsed: float, trainers: list[int], directive: Directive, epoch: float) -> list[int]:
        """Ask the policy; put its decision in step k+1's directive; return the fleet after it."""
        decision = self.policy.decide(k, elapsed, len(trainers), epoch)
        if decision is None:
            return list(trainers)
        s = self.state
        plan = scaling.plan(
            decision,
            step=k,
            applied_at=k + 1,
            elapsed=elapsed,
            trainers=trainers,
            recent_loss=s.recent_loss,
            min_workers=self.spec.scaling.min_workers,
            next_id=s.next_id,
        )
        s.next_id += len(plan.joined)
        if plan.joined and self.time.fleet:
            self.time.fleet.launch(plan.joined)  # launched now, at this step's fleet time: one cold start
        for start in plan.starts(round_=self.round, barrier=k + 1, cursor=s.cursor + len(trainers)):
            self._launch(start)
        s.scale_events += plan.events
        plan.write(directive)
        return plan.after

    # -- lost workers ----------------------------------------------------------------
    def _check_liveness(self) -> None:
        """Give up on workers that died or went silent while the step waits for them."""
        s, waiting = self.state, self.state.clock + 1
        missing = self.inbox.missing(waiting, s.members)
        if not missing:
            return
        lost = failures.lost_workers(
            missing,
            exited=self.launcher.exited(),
            faults=self.spec.faults,
            round_elapsed=self.time.host.round_elapsed(),
            stalled_s=self._running(self._last_progress),
            heartbeats=self.updates.heartbeats,
            age=self.pauses.age,
        )
        if not lost:
            return
        if late := self.signals.next_reports(LAST_WORD_S):
            # A worker that exited may have said why just before (a corrupt checkpoint at
            # start-up): its report decides, not its exit code. Judge again at the next poll.
            for r in late:
                self._take(r)
            return
        failures.on_loss(
            lost,
            waiting,
            faults=self.spec.faults,
            mode=s.mode,
            survivors=[w for w in s.members if w not in lost],
            directive_staged=waiting in self._staged,
        )
        at = self.time.elapsed()
        self.inbox.ended_at.update(dict.fromkeys(lost, at))
        directive = failures.go_on_without(
            lost,
            waiting,
            state=s,
            staged=self._staged[waiting],
            at=at,
            launcher=self.launcher,
            updates=self.updates,
            fleet=self.time.fleet,
        )
        self._release(waiting, s.members, directive)

    def _running(self, since: float) -> float:
        """Seconds of this round we ran since round time ``since`` (our pauses left out)."""
        return self.pauses.age(self.time.host.round_started + since)

    # -- the end of the round --------------------------------------------------------
    def _save(self) -> dict[str, Any]:
        """Every worker has checkpointed (or stopped): save our state, commit the round."""
        s = self.state
        s.finished = s.stop.reason is not None and s.stop.step is not None and s.clock >= s.stop.step
        if s.finished:
            self.time.host.stop()
        self.inbox.discard_upto(s.clock, self.updates)
        s.round = self.round
        s.checkpoint_puts += 2  # our state and latest.json
        checkpoint.write_supervisor(self.checkpoints, self.round, self.snapshot())
        checkpoint.commit_round(self.checkpoints, self.round, finished=s.finished, workers=s.members)
        return {
            "status": "finished" if s.finished else "unfinished",
            "round": self.round + 1,
            "workers": list(s.members),
            "steps": s.clock + 1,
            "stop_reason": s.stop.reason,
        }

    def failure_report(self, error: str) -> dict[str, Any]:
        """A ``failed`` report of the job as far as it got: the cause, steps, history."""
        return finalize.failure_report(self.spec, self.snapshot(), error, failed_in_round=self.round)
