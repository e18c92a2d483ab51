"""The supervisor: one round of the control loop (DESIGN §1–4, §6).

It never touches a worker's data path: it reads small reports and writes one directive
per step (go on / evict / join / stop / end of round). Steps are *closed* in order; the
directive of step k is what lets BSP and ISP workers go past their barrier, and what
tells SSP workers how far the slowest one is.

The supervisor is not on the barrier's critical path. While step k+1 runs it closes
step k (loss, history, stop criteria, the scaling policy) and hands the signal channel
the directive of step k+1, which the channel delivers the moment the last worker
announces step k+1 (inside Redis, in one script). So a decision taken on step k's loss
takes effect at barrier k+1, and membership changes from step k+2. Should the
supervisor fall behind, the channel delivers the directive when it arrives instead:
slower, never different.

A round is bounded (``round_seconds``, ``round_steps``; on Lambda the function's
timeout). Near its end the supervisor names the round's last step R in a directive
(under SSP ``slack`` steps ahead, so no worker has trained past it), closes R, decides
the next step's directive but holds it, waits for every worker's checkpoint, and saves
its own state with that held directive. The next round — a fresh supervisor and fresh
workers — starts from there; nothing is carried in memory. Its ``state_dict`` is the
whole of what it knows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

from ebb.cost.meter import JobAccount, meter_for
from ebb.cost.model import would_exceed
from ebb.engine import checkpoint
from ebb.engine.clock import JobClock, wall
from ebb.engine.fleet_clock import FleetTimeline, Links, WorkerStep
from ebb.engine.messages import Directive, EndReport, StepReport
from ebb.engine.worker import (ABORT_BLOB, SUPERVISOR, EngineError, WorkerStart, load_manifest, lost_blob, replica_blob,
                               sync_mode)
from ebb.models import LOSS_NAMES, loss_value
from ebb.spec import JobSpec
from ebb.stores.base import ObjectStore, SignalChannel, UpdateStore

REPORT_POLL_S = 0.5
ROUND_GRACE_S = 30.0  # past round_seconds, a round still waiting on its workers has lost one
LOSS_EWMA = 0.3  # weight of the newest step in a worker's recent loss
STEP_EWMA = 0.2  # weight of the newest step in the step-time estimate that times the round's end
TOTALS_FIELDS = ("bytes_sent", "bytes_received", "updates_sent", "empty_steps", "sent_nnz", "local_nnz",
                 "object_gets", "reports", "cpu_seconds", "cpu_critical_seconds")


class RoundLost(EngineError):
    """The round cannot go on (a worker or the update store is gone); it can be run again
    from the last complete round's checkpoints."""


class WorkerLauncher(Protocol):
    def launch(self, start: WorkerStart) -> None: ...

    def exited(self) -> dict[int, str]:
        """Workers whose process ended abnormally, with how ("was killed by signal 9 (SIGKILL)")."""
        ...

    def stop(self, worker: int) -> None:
        """Make sure a worker given up on is gone (a stalled process is killed)."""
        ...


class MetricsSink(Protocol):
    def step(self, record: dict) -> None: ...

    def close(self, report: dict) -> None: ...


class NullSink:
    def step(self, record: dict) -> None:
        pass

    def close(self, report: dict) -> None:
        pass


def policy_for(spec: JobSpec):
    """The scaling policy of a job (SSP and single-worker jobs never scale)."""
    from ebb.autotune.policies import make_policy

    s = spec.scaling
    if spec.sync.mode == "ssp" or (spec.workers == 1 and s.policy != "schedule"):
        return make_policy("none")
    if s.policy == "autotune":
        return make_policy("autotune", interval_s=s.interval_s, horizon_s=s.horizon_s, tolerance=s.tolerance,
                           knee_tolerance=s.knee_tolerance, knee_patience=s.knee_patience,
                           knee_min_drop=s.knee_min_drop, min_workers=s.min_workers,
                           throughput_tolerance=s.throughput_tolerance)
    if s.policy == "schedule":
        return make_policy("schedule", schedule=[e.model_dump() for e in s.schedule], min_workers=s.min_workers,
                           max_workers=max([spec.workers] + [e.workers for e in s.schedule]))
    return make_policy("none")


def new_state(spec: JobSpec) -> dict:
    """The supervisor's state before the first round."""
    members = list(range(spec.workers))
    return {
        "job": spec.name, "round": -1, "finished": False, "mode": sync_mode(spec),
        "clock": -1, "cursor": 0, "members": members, "upcoming": members, "next_id": spec.workers,
        "held": Directive(step=0).model_dump(exclude_none=True),  # the directive of step clock + 1
        "elapsed": 0.0, "host_elapsed": 0.0, "fleet": None,
        "worker_seconds": 0.0, "worker_invocations": 0, "checkpoint_puts": 0, "directives": 0,
        "history": [], "scale_events": [], "totals": {k: 0 for k in TOTALS_FIELDS}, "timing": {},
        "stop_reason": None, "stop_step": None, "at_target": 0, "recent_loss": {},
        "test_hit": None, "eval_seconds": 0.0, "sync_samples": [], "sync_first": [], "handling_ms": [],
        "released_late": 0,
        "policy": None, "autotune": None, "faults": [], "best": None,
    }


class Supervisor:
    """One round of a job's control loop, started from the state the last round saved."""

    def __init__(self, spec: JobSpec, *, data: ObjectStore, checkpoints: ObjectStore, updates: UpdateStore,
                 signals: SignalChannel, launcher: WorkerLauncher, round_: int, sink: MetricsSink | None = None,
                 policy=None, round_seconds: float | None = None, restarts: list[dict] | None = None,
                 measure_of: Callable[[StepReport], WorkerStep] | None = None,
                 interrupted: Callable[[], BaseException | None] | None = None):
        self.spec, self.data, self.checkpoints = spec, data, checkpoints
        self.interrupted = interrupted  # the caller's stop request (a Ctrl-C), asked every poll
        self.updates, self.signals, self.launcher = updates, signals, launcher
        self.sink = sink or NullSink()
        self.policy = policy if policy is not None else policy_for(spec)
        self.meter = meter_for(spec)
        self.manifest = load_manifest(data)
        self.num_parts = len(self.manifest.train.parts)
        self.loss_name = LOSS_NAMES[spec.model]
        self.round = round_
        self.round_seconds = min(spec.round_seconds, round_seconds or math.inf)
        self.load_state_dict(new_state(spec) if round_ == 0 else checkpoint.read_supervisor(checkpoints, round_ - 1))
        if self.state_round != round_ - 1:
            raise checkpoint.CheckpointError(f"round {round_} needs the state of round {round_ - 1}, "
                                             f"found round {self.state_round}'s")
        self.faults += restarts or []  # earlier attempts at this round that were given up
        # Host time always runs (round deadlines, liveness, host_seconds); the job's own
        # time is the fleet clock's when clock.kind is fleet (docs/ARCHITECTURE.md, "Fleet clock").
        self.job_clock = JobClock(before=self.host_before)
        self.fleet: FleetTimeline | None = None
        if spec.clock.kind == "fleet":
            fleet = self.fleet_before or {"time": 0.0, "worker_seconds": 0.0}
            self.fleet = FleetTimeline(Links.of(spec.clock), spec.sync.slack if self.mode == "ssp" else 0,
                                       time=fleet["time"], worker_seconds=fleet["worker_seconds"])
        # A worker's step as the fleet clock reads it: measured, or replayed by a test.
        self.measure_of = measure_of or WorkerStep.of
        # This round only: reports of unclosed steps, workers' starts and ends, the steps
        # whose updates still sit in the update store, and the end of round once named.
        self.steps: dict[int, dict[int, StepReport]] = {}
        self.started_at: dict[int, float] = {}
        self.ended: dict[int, EndReport] = {}
        self.ended_at: dict[int, float] = {}
        self.senders: dict[int, list[int]] = {}
        self.discarded_upto = self.clock
        self.first_step = self.clock + 1
        self.round_end: int | None = None
        self._last_close: float | None = None
        self._step_s: float | None = None
        self.sync_by_step: dict[int, list[float]] = {}
        self._new_test: float | None = None  # a test scoring not yet shown to the sink
        self._early_tests: dict[int, tuple[str, float]] = {}  # scorings of steps not closed yet
        self._staged: dict[int, Directive] = {}  # released directives of steps not yet closed
        self.handling_ms: list[float] = []  # per closed step: the supervisor's own work for it
        self._last_progress = 0.0  # round time of the last closed step: how long we have waited

    # -- state ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything the next round needs (JSON-able)."""
        return {
            "job": self.spec.name, "round": self.state_round, "finished": self.finished, "mode": self.mode,
            "clock": self.clock, "cursor": self.cursor, "members": self.members, "upcoming": self.upcoming,
            "next_id": self.next_id, "held": self.held.model_dump(exclude_none=True) if self.held else None,
            "elapsed": self.elapsed(), "host_elapsed": self.job_clock.elapsed(),
            "fleet": self.fleet.state_dict() if self.fleet else None, "worker_seconds": self.worker_seconds(),
            "worker_invocations": self.worker_invocations, "checkpoint_puts": self.checkpoint_puts,
            "directives": self.directives, "history": self.history, "scale_events": self.scale_events,
            "totals": self.totals, "timing": self.timing, "stop_reason": self.stop_reason,
            "stop_step": self.stop_step, "at_target": self.at_target,
            "recent_loss": {str(w): v for w, v in self.recent_loss.items()}, "test_hit": self.test_hit,
            "eval_seconds": self.eval_seconds, "sync_samples": [round(x, 6) for x in self.sync_samples],
            "sync_first": self.sync_first + [min(v) for _, v in sorted(self.sync_by_step.items()) if v],
            "handling_ms": self.handling_before + [round(x, 4) for x in self.handling_ms],
            "released_late": self.released_late, "policy": self.policy.state_dict(),
            "autotune": self.autotune_summary(), "faults": self.faults, "best": self.best,
        }

    def load_state_dict(self, state: dict) -> None:
        if state["job"] != self.spec.name:
            raise checkpoint.CheckpointError(f"the checkpoint belongs to job {state['job']}, not {self.spec.name}")
        if state["mode"] != sync_mode(self.spec):
            raise checkpoint.CheckpointError(f"the job's checkpoints were written under sync mode {state['mode']} "
                                             f"but the job now runs {sync_mode(self.spec)}")
        self.state_round, self.finished, self.mode = state["round"], state["finished"], state["mode"]
        self.clock, self.cursor = state["clock"], state["cursor"]
        self.members, self.upcoming, self.next_id = list(state["members"]), list(state["upcoming"]), state["next_id"]
        self.held = Directive.model_validate(state["held"]) if state["held"] else None
        self.host_before = state.get("host_elapsed", state["elapsed"])
        self.fleet_before = state.get("fleet")
        self.worker_seconds_before = state["worker_seconds"]
        self.worker_invocations, self.checkpoint_puts = state["worker_invocations"], state["checkpoint_puts"]
        self.directives = state["directives"]
        self.history, self.scale_events = state["history"], state["scale_events"]
        self.totals, self.timing = dict(state["totals"]), dict(state["timing"])
        self.stop_reason, self.stop_step, self.at_target = state["stop_reason"], state["stop_step"], state["at_target"]
        self.recent_loss = {int(w): v for w, v in state["recent_loss"].items()}
        self.test_hit, self.eval_seconds = state["test_hit"], state["eval_seconds"]
        self.sync_samples, self.sync_first = list(state["sync_samples"]), list(state["sync_first"])
        self.handling_before = list(state["handling_ms"])
        self.released_late = state["released_late"]
        self.faults = list(state["faults"])
        self.best = state["best"]  # the best validation scoring: value, step, epoch, scorings since
        if state["policy"] is not None:
            self.policy.load_state_dict(state["policy"])

    # -- accounting ----------------------------------------------------------------
    def elapsed(self) -> float:
        """The job's time: the fleet clock's (at the last closed step) or the host's."""
        return self.fleet.time if self.fleet else self.job_clock.elapsed()

    def worker_seconds(self) -> float:
        if self.fleet:
            return self.fleet.worker_seconds
        now = self.elapsed()
        return self.worker_seconds_before + sum(self.ended_at.get(w, now) - t for w, t in self.started_at.items())

    def account(self) -> JobAccount:
        return JobAccount(wall_seconds=self.elapsed(), worker_seconds=self.worker_seconds(), rounds=self.round + 1,
                          worker_invocations=self.worker_invocations, object_gets=self.totals["object_gets"],
                          object_puts=self.checkpoint_puts, reports=self.totals["reports"],
                          directives=self.directives)

    def cost(self) -> dict:
        return self.meter(self.account())

    def loss_value(self, loss_sum: float, samples: int) -> float:
        return loss_value(self.loss_name, loss_sum, samples)

    # -- the round -----------------------------------------------------------------
    def run_round(self) -> dict:
        """Run this round to its end: ``{"status": "finished" | "unfinished", ...}``."""
        if self.finished:
            raise EngineError(f"job {self.spec.name} has finished already (round {self.state_round})")
        try:
            self._start_workers()
            self._run_until_over()
        except Exception as exc:
            try:  # the workers still waiting at a barrier leave instead of waiting out their timeouts
                self.updates.put_blob(ABORT_BLOB, str(exc)[:500].encode())
            except Exception:  # the update store may be what failed
                pass
            raise
        return self._save()

    def _run_until_over(self) -> None:
        while not self._round_over():
            if self.interrupted is not None and (stop := self.interrupted()) is not None:
                raise stop
            self.updates.heartbeat(SUPERVISOR, wall())  # workers waiting long look for it
            reports = self.signals.next_reports(REPORT_POLL_S)
            busy = time.perf_counter()
            for r in reports:
                self._take(r)
            closed = 0
            while self._step_complete(self.clock + 1) and not self._last_step_closed():
                self._close_step(self.clock + 1)
                closed += 1
            if closed:  # the supervisor's own time per step: reading reports, closing, deciding
                self.handling_ms += [1000 * (time.perf_counter() - busy) / closed] * closed
                self.updates.heartbeat(SUPERVISOR, wall())  # scoring and the tuner's fits take a while
            if not reports:
                self._check_liveness()
                if self.job_clock.round_elapsed() > self.round_seconds + ROUND_GRACE_S:
                    raise EngineError(self._overdue())

    def _start_workers(self) -> None:
        held, self.held = self.held, None
        self._release(held.step, self.members, held.model_copy(update={"round": self.round}))
        if self.fleet:
            self.fleet.launch(self.members)  # the round's wave of invocations: one cold start
        for w in self.members:
            resume = checkpoint.worker_key(self.round - 1, w) if self.round > 0 else None
            self._launch(WorkerStart(worker=w, members=list(self.members), round=self.round, step=self.clock + 1,
                                     cursor=self.cursor, resume=resume))

    def _launch(self, start: WorkerStart) -> None:
        self.started_at[start.worker] = self.elapsed()
        self.worker_invocations += 1
        self.launcher.launch(start)

    def _overdue(self) -> str:
        waiting = self.clock + 1
        missing = sorted(set(self.members) - set(self.steps.get(waiting, {})) - set(self.ended))
        return (f"round {self.round} ran {self.job_clock.round_elapsed():.0f} s, past its {self.round_seconds:g} s: "
                f"still waiting for worker(s) {missing} to report step {waiting}")

    def _last_step_closed(self) -> bool:
        """The round's last step is closed: the stop step, or the round's end if that comes first."""
        ends = [s for s in (self.stop_step if self.stop_reason else None, self.round_end) if s is not None]
        return bool(ends) and self.clock >= min(ends)

    def _round_over(self) -> bool:
        return self._last_step_closed() and all(w in self.ended for w in self.members)

    def _release(self, step: int, trainers: list[int], directive: Directive) -> None:
        self.directives += 1
        self._staged[step] = directive
        if self.signals.release(step, trainers, directive):
            self.released_late += 1

    # -- liveness ------------------------------------------------------------------
    def _check_liveness(self) -> None:
        """Give up on workers that died (their process ended) or went silent (no heartbeat
        for ``faults.worker_timeout_s``) while the step waits for them."""
        waiting = self.clock + 1
        missing = [w for w in self.members if w not in self.steps.get(waiting, {}) and w not in self.ended]
        if not missing:
            return
        exited = self.launcher.exited()
        lost = {w: exited[w] for w in missing if w in exited}
        faults = self.spec.faults
        now = self.job_clock.round_elapsed()
        if now - self._last_progress > faults.worker_timeout_s:
            beats, at = self.updates.heartbeats(missing), wall()
            for w in missing:
                if w in lost:
                    continue
                if w not in beats and now > faults.startup_timeout_s:
                    lost[w] = f"sent no heartbeat in the round's first {faults.startup_timeout_s:g} s"
                elif w in beats and at - beats[w] > faults.worker_timeout_s:
                    lost[w] = f"went silent (no heartbeat for {at - beats[w]:.0f} s)"
        if lost:
            self._lose(lost, waiting)

    def _lose(self, lost: dict[int, str], k: int) -> None:
        """Go on without ``lost`` from step k (``faults.on_worker_loss``), or give the round up."""
        what = "; ".join(f"worker {w} {why}" for w, why in sorted(lost.items()))
        policy = self.spec.faults.on_worker_loss
        if policy == "fail":
            raise EngineError(f"{what} at step {k} (faults.on_worker_loss: fail)")
        survivors = [w for w in self.members if w not in lost]
        if policy == "restart_round" or self.mode == "ssp" or not survivors or k not in self._staged:
            raise RoundLost(f"{what} at step {k}")
        at = self.elapsed()
        if self.fleet:
            self.fleet.leave(lost)
        for w, why in sorted(lost.items()):
            self.launcher.stop(w)
            self.updates.put_blob(lost_blob(w), b"1")  # should it come back, it leaves quietly
            self.ended_at[w] = at
            self.recent_loss.pop(w, None)
            self.scale_events.append({"step": k, "applied_at": k, "time": round(at, 3), "action": "lost",
                                      "worker": w, "reason": why})
        # Step k's directive now names the survivors: it opens their barrier, and its
        # fleet from step k + 1 leaves the lost out. (A lost worker's replica is gone with
        # it; its unsent ISP updates are the price of going on.)
        staged = self._staged[k]
        upcoming = [w for w in self.upcoming if w not in lost]
        directive = staged.model_copy(update={"members": upcoming,
                                              "evict": [w for w in staged.evict if w not in lost],
                                              "donors": [w for w in staged.donors if w not in lost]})
        self.members, self.upcoming = survivors, upcoming
        self._release(k, survivors, directive)

    def _take(self, r: StepReport | EndReport) -> None:
        if isinstance(r, StepReport) and (r.step <= self.clock or r.worker in self.steps.get(r.step, {})):
            return  # delivered twice (at-least-once channels), or from a worker already given up
        if isinstance(r, EndReport) and r.worker in self.ended:
            return
        if isinstance(r, EndReport) and r.outcome == "failed":
            raise EngineError(f"worker {r.worker} failed after step {r.step}: {r.error}")
        if isinstance(r, EndReport):
            self._count(r)  # (a step's reports count when it closes: the same usage at each step, run to run)
        if isinstance(r, StepReport):
            self.steps.setdefault(r.step, {})[r.worker] = r
            if r.test:
                self._take_test(r.test)
            if r.sync_seconds is not None:
                self.sync_samples.append(r.sync_seconds)
                self.sync_by_step.setdefault(r.step - 1, []).append(r.sync_seconds)
        else:
            self.ended[r.worker] = r
            self.ended_at[r.worker] = self.elapsed()
            if r.checkpoint:
                self.checkpoint_puts += 1

    def _count(self, r: StepReport | EndReport) -> None:
        t = self.totals
        t["bytes_received"] += r.read_bytes
        t["object_gets"] += r.object_gets
        t["reports"] += 1
        t["cpu_seconds"] += r.cpu_seconds
        for k, v in r.timing.items():
            self.timing[k] = self.timing.get(k, 0.0) + v

    def _take_test(self, test: dict) -> None:
        """A scoring of the held-out split (validation, or test when the data has none)."""
        self.eval_seconds += test["seconds"]
        step, split = test["step"], test.get("split", "test")
        value = test["metrics"][self.loss_name]  # the held-out metric named like the training loss
        self._new_test = value
        if step < len(self.history):
            self.history[step][split] = value
            self.history[step]["eval_seconds_total"] = round(self.eval_seconds, 4)
        else:  # taken in the same batch of reports as its own step's: recorded when that step closes
            self._early_tests[step] = (split, value)
        if split == "val":  # early stopping: the same rule the scoring worker used to keep its best replica
            best = self.best
            if best is None or value < best["value"] * (1 - self.spec.stop.min_delta):
                self.best = {"value": value, "step": step, "epoch": test.get("epoch"), "since": 0}
            else:
                best["since"] += 1
        target = self.spec.stop.target_test
        if target is not None and value <= target and self.test_hit is None:
            at = self.history[step]["time"] if step < len(self.history) else self.elapsed()
            # Host time holds the scorings; fleet time never did (scoring CPU is not in cpu_seconds).
            scoring = 0.0 if self.fleet else self.eval_seconds - test["seconds"]
            self.test_hit = {
                "step": step,
                "time": at,
                "seconds_excluding_eval": at - scoring,
                self.loss_name: value,
            }

    def _step_complete(self, k: int) -> bool:
        got = self.steps.get(k, {})
        return all(w in got for w in self.members)

    def _close_step(self, k: int) -> None:
        reports = {w: r for w, r in self.steps.pop(k).items() if w in self.members}
        self._staged.pop(k, None)
        self._last_progress = self.job_clock.round_elapsed()
        trained = list(self.members)
        for r in reports.values():
            self._count(r)
        loss = self.loss_value(sum(r.loss_sum for r in reports.values()), sum(r.samples for r in reports.values()))
        # The workers step their cursor past every position of the step, a lost worker's too.
        self.cursor += len(next(iter(reports.values())).members)
        epoch = self.cursor / self.num_parts
        if self.fleet:
            joining = len(set(self.upcoming) - set(self.members))  # launched, not training yet: billed
            self.fleet.close(k, {w: self.measure_of(r) for w, r in reports.items()}, waiting=joining)
        elapsed = self.elapsed()
        self._time_step()
        t = self.totals
        sent = sum(r.sent_bytes for r in reports.values())
        t["bytes_sent"] += sent
        # With a core per worker a step takes as long as its busiest worker's CPU.
        t["cpu_critical_seconds"] += max(r.cpu_seconds for r in reports.values())
        t["updates_sent"] += sum(not r.empty for r in reports.values())
        t["empty_steps"] += sum(r.empty for r in reports.values())
        sent_nnz = sum(r.sent_nnz for r in reports.values())
        local_nnz = sum(r.local_nnz for r in reports.values())
        t["sent_nnz"] += sent_nnz
        t["local_nnz"] += local_nnz
        if not math.isfinite(loss):
            self._diverged(k, reports)
        for w, r in reports.items():
            mine = self.loss_value(r.loss_sum, r.samples)
            prev = self.recent_loss.get(w)
            self.recent_loss[w] = mine if prev is None else LOSS_EWMA * mine + (1 - LOSS_EWMA) * prev
        record = {
            "step": k,
            "time": round(elapsed, 4),
            "host_time": round(self.job_clock.elapsed(), 4),
            "loss": loss,
            "epoch": round(epoch, 4),
            "workers": len(trained),
            "round": self.round,
            "bytes_sent": sent,
            "bytes_received": sent * (len(trained) - 1),
            "sent_fraction": sent_nnz / local_nnz if local_nnz else 0.0,
        }
        cost = self.cost()
        record["cost_usd"] = cost["total_usd"]
        if (early := self._early_tests.pop(k, None)) is not None:
            record[early[0]] = early[1]
            record["eval_seconds_total"] = round(self.eval_seconds, 4)
        self.history.append(record)

        self.senders[k] = sorted(w for w, r in reports.items() if r.sent_bytes)
        if self.stop_reason is None:
            self._decide_next(k, loss, epoch, elapsed, cost)
        else:
            self.members = self.upcoming
        phases = {name for r in reports.values() for name in r.timing}
        timing = {name: sum(r.timing.get(name, 0.0) for r in reports.values()) / len(reports) for name in phases}
        self.sink.step(
            {**record, "active": len(self.members), "stop": self.stop_reason, "timing": timing, "test": self._new_test}
        )
        self._new_test = None
        self.clock = k
        # Every worker has applied the steps up to min(applied): their updates can go.
        self._discard_upto(min(r.applied_upto for r in reports.values()))

    def _diverged(self, k: int, reports: dict[int, StepReport]) -> None:
        bad = sorted(w for w, r in reports.items() if not math.isfinite(self.loss_value(r.loss_sum, r.samples)))
        lr = self.spec.hyper.lr
        raise EngineError(
            f"the training loss diverged at step {k}: worker(s) {bad} computed a non-finite loss "
            f"(epoch {self.cursor / self.num_parts:.2f}); the learning rate {lr:g} is too high for this data: "
            f"lower hyper.lr (--lr), e.g. to {lr / 4:g}"
        )

    def _discard_upto(self, applied: int) -> None:
        for step in range(self.discarded_upto + 1, applied + 1):
            if self.senders.get(step):
                self.updates.discard([step], self.senders[step])
            self.senders.pop(step, None)
        self.discarded_upto = max(self.discarded_upto, applied)

    def _time_step(self) -> None:
        """Track the step time (close to close) that decides when the round must end."""
        now = self.job_clock.round_elapsed()
        if self._last_close is not None:
            d = now - self._last_close
            self._step_s = d if self._step_s is None else STEP_EWMA * d + (1 - STEP_EWMA) * self._step_s
            if self._step_s > self.round_seconds:
                raise EngineError(
                    f"round_seconds ({self.round_seconds:g} s) is shorter than one training step "
                    f"({self._step_s:.2f} s measured): raise round_seconds in the job spec "
                    f"(or --round-seconds)"
                )
        self._last_close = now

    def _round_ends_at(self, nxt: int) -> int | None:
        """The round's last step, if the directive of ``nxt`` must name it (else None).

        Under SSP a worker may already be training ``slack`` steps past ``nxt`` when the
        directive arrives, so the last step is ``nxt + slack``: no one has trained past it.
        """
        last = nxt + (self.spec.sync.slack if self.mode == "ssp" else 0)
        limit = self.spec.round_steps
        if limit is not None and last - self.first_step + 1 >= limit:
            return last
        if self._step_s is not None and math.isfinite(self.round_seconds):
            if self.job_clock.round_elapsed() + (last - self.clock + 1) * self._step_s >= self.round_seconds:
                return last
        return None

    def _decide_next(self, k: int, loss: float, epoch: float, elapsed: float, cost: dict) -> None:
        """Write step k+1's directive from what step k showed (stop, evict, join, end of round)."""
        nxt = k + 1
        trainers = self.upcoming  # who trains step k+1 and hears its directive
        # Epochs after step k+1, so max_epochs stops where it did when decisions were immediate.
        epoch_next = (self.cursor + len(trainers)) / self.num_parts
        self.stop_reason = self._stop_reason(loss, epoch_next, elapsed, cost, k)
        self.policy.observe(k, elapsed, loss, len(self.members), epoch)
        directive = Directive(step=nxt, round=self.round, stop=bool(self.stop_reason))
        if self.stop_reason:
            self.stop_step = nxt
        if self.round_end is not None and k >= self.round_end:
            # The round's last step is closed: this directive (a stop too) opens the next
            # round's first step.
            self.held = directive
            self.members, self.upcoming = trainers, list(trainers)
            return
        after = list(trainers)
        if not self.stop_reason:
            if self.round_end is None:
                self.round_end = self._round_ends_at(nxt)
            if self.round_end is None:
                after = self._scale(k, nxt, elapsed, trainers, directive, epoch)
            directive.round_end = self.round_end  # (no scaling while a round winds down)
        self._release(nxt, trainers, directive)
        self.members, self.upcoming = trainers, after

    def _stop_reason(self, loss: float, epoch_next: float, elapsed: float, cost: dict, k: int) -> str | None:
        stop = self.spec.stop
        if self.test_hit is not None:
            return "converged"
        if self.best is not None and self.best["since"] >= stop.patience_evals:
            return "early_stopped"
        if stop.target_loss is not None:
            self.at_target = self.at_target + 1 if loss <= stop.target_loss else 0
            if self.at_target >= stop.patience:
                return "converged"
        if epoch_next >= self.spec.epoch_limit(bool(self.manifest.val.parts)):
            return "max_epochs"
        if elapsed >= stop.max_seconds:
            return "max_time"
        if stop.budget_usd is not None and k > 0:
            # Stop while the next steps still fit, keeping a margin for what is billed after
            # the stop (final replicas, merge, evaluation).
            per_step = cost["total_usd"] / (k + 1)
            if would_exceed(cost["total_usd"] + 2 * per_step, stop.budget_usd):
                return "budget"
        return None

    def _scale(
        self, k: int, nxt: int, elapsed: float, trainers: list[int], directive: Directive, epoch: float
    ) -> list[int]:
        """Ask the policy; put its decision in step ``nxt``'s directive; return the fleet after it."""
        from ebb.autotune.policies import pick_eviction

        decision = self.policy.decide(k, elapsed, len(trainers), epoch)
        if decision is None:
            return list(trainers)
        min_workers = self.spec.scaling.min_workers
        after = list(trainers)
        event = {"step": k, "applied_at": nxt, "time": round(elapsed, 3), "reason": decision.reason}
        if decision.action == "evict":
            evict: list[int] = []
            for _ in range(decision.count):
                if len(trainers) - len(evict) <= min_workers:
                    break
                candidates = {w: self.recent_loss.get(w, 0.0) for w in trainers if w not in evict}
                evict.append(pick_eviction(candidates))
            for w in evict:
                self.scale_events.append(
                    {**event, "action": "evict", "worker": w, "recent_loss": self.recent_loss.get(w)}
                )
            after = [w for w in trainers if w not in evict]
            directive.evict = evict
        elif decision.action == "join":
            donor = trainers[0]
            joined = list(range(self.next_id, self.next_id + decision.count))
            self.next_id += decision.count
            after = sorted(trainers + joined)
            if self.fleet:
                self.fleet.launch(joined)  # launched now, at this step's fleet time: one cold start
            directive.donors = [donor]
            for w in joined:
                # It starts after barrier ``nxt``, from the donor's replica as of that barrier.
                self._launch(
                    WorkerStart(
                        worker=w,
                        members=list(after),
                        round=self.round,
                        step=nxt + 1,
                        cursor=self.cursor + len(trainers),
                        donor_blob=replica_blob(donor, nxt),
                    )
                )
                self.scale_events.append({**event, "action": "join", "worker": w, "donor": donor})
        directive.members = list(after)
        return after

    # -- the end of the round ------------------------------------------------------
    def _save(self) -> dict:
        """Every worker has checkpointed (or stopped): save our state, commit the round."""
        self.finished = self.stop_reason is not None and self.clock >= self.stop_step
        if self.finished:
            self.job_clock.stop()
        self._discard_upto(self.clock)
        self.state_round = self.round
        self.checkpoint_puts += 2  # our state and latest.json
        checkpoint.write_supervisor(self.checkpoints, self.round, self.state_dict())
        checkpoint.commit_round(self.checkpoints, self.round, finished=self.finished, workers=self.members)
        return {
            "status": "finished" if self.finished else "unfinished",
            "round": self.round + 1,
            "workers": list(self.members),
            "steps": self.clock + 1,
            "stop_reason": self.stop_reason,
        }

    def failure_report(self, error: str) -> dict:
        """A ``failed`` report of the job as far as it got: the cause, steps, history."""
        from ebb.engine.finalize import build_report

        report = build_report(self.spec, self.state_dict(), {}, 0.0)
        report.update({"status": "failed", "error": error, "failed_in_round": self.round})
        report.pop("finalize_seconds", None)
        return report

    def autotune_summary(self) -> dict | None:
        """What the auto-tuner saw: its knee and every interval's s_Δ (why it did or did not evict)."""
        tuner = getattr(self.policy, "tuner", None)
        if tuner is None:
            return None
        return {"knee_step": tuner.knee_step, "tolerance": tuner.tolerance, "decisions": tuner.decisions}
