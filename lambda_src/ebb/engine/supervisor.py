"""The supervisor loop (DESIGN §1–4): membership, the step barrier, loss aggregation,
stop criteria, the scaling policy, and the final merge and evaluation.

It never touches a worker's data path: it reads small reports and writes one directive
per step (go on / evict / join / stop). Steps are *cleared* in order; the directive of
step k is what lets BSP and ISP workers go past their barrier, and what tells SSP
workers how far the slowest one is.

The supervisor is not on the barrier's critical path. While step k+1 runs it closes
step k (loss, history, stop criteria, the scaling policy) and hands the signal channel
the directive of step k+1, which the channel delivers the moment the last worker
announces step k+1 (inside Redis, in one script). So a decision taken on step k's loss
takes effect at barrier k+1, and membership changes from step k+2. Should the
supervisor fall behind, the channel delivers the directive when it arrives instead:
slower, never different.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np
import torch

from ebb.cost.model import perf_per_dollar, would_exceed
from ebb.data.format import decode_batch
from ebb.engine.worker import EngineError, PartCache, WorkerStart, final_blob, load_manifest, replica_blob
from ebb.models import LOSS_NAMES, build_model, loss_value
from ebb.spec import JobSpec
from ebb.stores.base import ObjectStore, SignalChannel, UpdateStore

REPORT_POLL_S = 0.5
LOSS_EWMA = 0.3  # weight of the newest step in a worker's recent loss


class WorkerLauncher(Protocol):
    def launch(self, start: WorkerStart) -> None: ...

    def failed(self) -> str | None:
        """A description of a worker that died, if any did."""
        ...


class MetricsSink(Protocol):
    def step(self, record: dict) -> None: ...

    def close(self, report: dict) -> None: ...


class NullSink:
    def step(self, record: dict) -> None:
        pass

    def close(self, report: dict) -> None:
        pass


@dataclass
class Totals:
    bytes_sent: int = 0
    bytes_received: int = 0
    worker_seconds: float = 0.0
    updates_sent: int = 0
    empty_steps: int = 0
    sent_nnz: int = 0
    local_nnz: int = 0
    object_gets: int = 0
    reports: int = 0
    cpu_seconds: float = 0.0  # workers' process time over their steps (test scoring excluded)
    cpu_critical_seconds: float = 0.0  # per step, the busiest worker's process time, summed over steps
    timing: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "worker_seconds": round(self.worker_seconds, 3), "updates_sent": self.updates_sent,
                "empty_steps": self.empty_steps, "object_gets": self.object_gets, "reports": self.reports,
                "cpu_seconds": round(self.cpu_seconds, 3), "cpu_critical_seconds": round(self.cpu_critical_seconds, 3),
                "sent_fraction": self.sent_nnz / self.local_nnz if self.local_nnz else 0.0,
                "timing_seconds": {k: round(v, 4) for k, v in sorted(self.timing.items())}}




def policy_for(spec: JobSpec):
    """The scaling policy of a job (SSP and single-worker jobs never scale)."""
    from ebb.autotune.policies import make_policy

    s = spec.scaling
    if spec.sync.mode == "ssp" or (spec.workers == 1 and s.policy != "schedule"):
        return make_policy("none")
    if s.policy == "autotune":
        return make_policy("autotune", interval_s=s.interval_s, horizon_s=s.horizon_s, tolerance=s.tolerance,
                           knee_tolerance=s.knee_tolerance, knee_patience=s.knee_patience, min_workers=s.min_workers)
    if s.policy == "schedule":
        return make_policy("schedule", schedule=[e.model_dump() for e in s.schedule], min_workers=s.min_workers,
                           max_workers=max([spec.workers] + [e.workers for e in s.schedule]))
    return make_policy("none")


class Supervisor:
    def __init__(self, spec: JobSpec, objects: ObjectStore, updates: UpdateStore, signals: SignalChannel,
                 launcher: WorkerLauncher, sink: MetricsSink | None = None, policy=None,
                 cost_meter: Callable[["Supervisor"], dict] | None = None):
        self.spec, self.objects, self.updates, self.signals = spec, objects, updates, signals
        self.launcher, self.sink = launcher, sink or NullSink()
        self.policy = policy if policy is not None else policy_for(spec)
        self.cost_meter = cost_meter
        self.manifest = load_manifest(objects)
        self.num_parts = len(self.manifest.train.parts)
        self.loss_name = LOSS_NAMES[spec.model]
        self.members = list(range(spec.workers))  # the fleet of the step to close next (clock + 1)
        self.upcoming = list(self.members)  # ... and of the step after it, as its directive decided
        self.next_id = spec.workers
        self.started_at: dict[int, float] = {}
        self.ended_at: dict[int, float] = {}
        self.steps: dict[int, dict[int, dict]] = {}
        self.clock = -1
        self.cursor = 0
        self.discarded_upto = -1
        self.senders: dict[int, list[int]] = {}  # step -> workers whose update key exists
        self.at_target = 0
        self.recent_loss: dict[int, float] = {}
        self.history: list[dict] = []
        self.scale_events: list[dict] = []
        self.sync_samples: list[float] = []  # per worker and step: last announce -> its go received
        self.released_late = 0  # steps whose directive came after the last announcement
        self.sync_by_step: dict[int, list[float]] = {}
        self.totals = Totals()
        self.stop_reason: str | None = None
        self.stop_step: int | None = None  # the step whose directive says stop
        self.finals: set[int] = set()
        self.eval_seconds = 0.0  # spent scoring the test split during training
        self.test_hit: dict | None = None  # first evaluation at or below stop.target_test
        self.test_reached = False
        self.t0 = time.monotonic()
        self.finished_at: float | None = None  # the clock stops here: wall time, cost, Perf/$ agree

    # -- accounting ----------------------------------------------------------------
    def now(self) -> float:
        return self.finished_at if self.finished_at is not None else time.monotonic()

    def elapsed(self) -> float:
        return self.now() - self.t0

    def worker_seconds(self) -> float:
        now = self.now()
        return sum(self.ended_at.get(w, now) - t for w, t in self.started_at.items())

    def loss_value(self, loss_sum: float, samples: int) -> float:
        return loss_value(self.loss_name, loss_sum, samples)

    def cost(self) -> dict | None:
        return self.cost_meter(self) if self.cost_meter else None

    # -- main loop -----------------------------------------------------------------
    def start_workers(self) -> None:
        self.signals.release(0, self.members, {"step": 0, "stop": False})
        for w in self.members:
            self.started_at[w] = time.monotonic()
            self.launcher.launch(WorkerStart(worker=w, members=list(self.members)))

    def run(self) -> dict:
        """Drive the job to its end; returns the report (``status`` says how it ended)."""
        self.t0 = time.monotonic()
        self.start_workers()
        while not (self.stop_reason and self.finals >= set(self.members)):
            reports = self.signals.next_reports(REPORT_POLL_S)
            if not reports and (dead := self.launcher.failed()):
                raise EngineError(dead)
            for r in reports:
                self._take(r)
            while self._step_complete(self.clock + 1) and not (self.stop_reason and self.clock >= self.stop_step):
                self._close_step(self.clock + 1)
        return self._finish()

    def _first_worker_median(self) -> float | None:
        """Median over steps of the quickest worker's go: the barrier without CPU queueing."""
        firsts = sorted(min(v) for v in self.sync_by_step.values() if v)
        return 1000 * firsts[len(firsts) // 2] if firsts else None

    def _take(self, r: dict) -> None:
        kind, w = r["type"], r["w"]
        self.totals.bytes_received += r.get("read_bytes", 0)
        self.totals.object_gets += r.get("object_gets", 0)
        self.totals.reports += 1
        self.totals.cpu_seconds += r.get("cpu_s", 0.0)
        for k, v in r.get("timing", {}).items():
            self.totals.timing[k] = self.totals.timing.get(k, 0.0) + v
        if kind == "step":
            self.steps.setdefault(r["t"], {})[w] = r
            if r.get("test"):
                self._take_test(r["test"])
            if r.get("sync_s") is not None:
                self.sync_samples.append(r["sync_s"])
                self.sync_by_step.setdefault(r["t"] - 1, []).append(r["sync_s"])
        elif kind in ("left", "final"):
            self.ended_at[w] = time.monotonic()
            if kind == "final":
                self.finals.add(w)

    def _take_test(self, test: dict) -> None:
        self.eval_seconds += test["seconds"]
        step = test["step"]
        main = self.loss_name  # the test metric named like the training loss
        value = test["metrics"][main]
        if step < len(self.history):
            self.history[step]["test"] = value
            self.history[step]["eval_seconds_total"] = round(self.eval_seconds, 4)
        target = self.spec.stop.target_test
        if target is not None and value <= target and self.test_hit is None:
            at = self.history[step]["time"] if step < len(self.history) else self.elapsed()
            self.test_hit = {"step": step, "time": at, "seconds_excluding_eval": at - (self.eval_seconds - test["seconds"]),
                             main: value}
            self.test_reached = True

    def _step_complete(self, k: int) -> bool:
        got = self.steps.get(k, {})
        return all(w in got for w in self.members)

    def _close_step(self, k: int) -> None:
        reports = self.steps.pop(k)
        trained = list(self.members)
        loss_sum = sum(r["loss_sum"] for r in reports.values())
        samples = sum(r["n"] for r in reports.values())
        loss = self.loss_value(loss_sum, samples)
        self.cursor += len(trained)
        epoch = self.cursor / self.num_parts
        elapsed = self.elapsed()
        t = self.totals
        sent = sum(r["sent_bytes"] for r in reports.values())
        t.bytes_sent += sent
        # With a core per worker a step takes as long as its busiest worker's CPU.
        t.cpu_critical_seconds += max(r.get("cpu_s", 0.0) for r in reports.values())
        t.updates_sent += sum(not r["empty"] for r in reports.values())
        t.empty_steps += sum(r["empty"] for r in reports.values())
        sent_nnz = sum(r["sent_nnz"] for r in reports.values())
        local_nnz = sum(r["local_nnz"] for r in reports.values())
        t.sent_nnz += sent_nnz
        t.local_nnz += local_nnz
        for w, r in reports.items():
            mine = self.loss_value(r["loss_sum"], r["n"])
            prev = self.recent_loss.get(w)
            self.recent_loss[w] = mine if prev is None else LOSS_EWMA * mine + (1 - LOSS_EWMA) * prev
        t.worker_seconds = self.worker_seconds()
        record = {"step": k, "time": round(elapsed, 4), "loss": loss, "epoch": round(epoch, 4),
                  "workers": len(trained), "bytes_sent": sent,
                  "bytes_received": sent * (len(trained) - 1),
                  "sent_fraction": sent_nnz / local_nnz if local_nnz else 0.0}
        cost = self.cost()
        if cost is not None:
            record["cost_usd"] = cost["total_usd"]
        self.history.append(record)

        self.senders[k] = sorted(w for w, r in reports.items() if r["sent_bytes"])
        if self.stop_reason is None:
            self._decide_next(k, loss, epoch, elapsed, cost)
        else:
            self.members = self.upcoming
        self.sink.step({**record, "active": len(self.members), "stop": self.stop_reason})
        self.clock = k
        # Every worker has applied the steps up to min(applied): their updates can go.
        applied = min(r["applied"] for r in reports.values())
        for step in range(self.discarded_upto + 1, applied + 1):
            if self.senders.get(step):
                self.updates.discard([step], self.senders.pop(step))
            self.senders.pop(step, None)
        self.discarded_upto = max(self.discarded_upto, applied)

    def _decide_next(self, k: int, loss: float, epoch: float, elapsed: float, cost: dict | None) -> None:
        """Write step k+1's directive from what step k showed (stop, evict, join)."""
        nxt = k + 1
        trainers = self.upcoming  # who trains step k+1 and hears its directive
        # Epochs after step k+1, so max_epochs stops where it did when decisions were immediate.
        epoch_next = (self.cursor + len(trainers)) / self.num_parts
        self.stop_reason = self._stop_reason(loss, epoch, epoch_next, elapsed, cost, k)
        directive: dict = {"step": nxt, "stop": bool(self.stop_reason)}
        after = list(trainers)
        if self.stop_reason:
            self.stop_step = nxt
        else:
            after = self._scale(k, nxt, elapsed, loss, epoch, trainers, directive)
        if self.signals.release(nxt, trainers, directive):
            self.released_late += 1
        self.members, self.upcoming = trainers, after

    def _stop_reason(self, loss: float, epoch: float, epoch_next: float, elapsed: float, cost: dict | None,
                     k: int) -> str | None:
        stop = self.spec.stop
        if not math.isfinite(loss):
            raise EngineError(f"the training loss diverged at step {k} ({loss}); lower the learning rate")
        if self.test_reached:
            return "converged"
        if stop.target_loss is not None:
            self.at_target = self.at_target + 1 if loss <= stop.target_loss else 0
            if self.at_target >= stop.patience:
                return "converged"
        if epoch_next >= stop.max_epochs:
            return "max_epochs"
        if elapsed >= stop.max_seconds:
            return "max_time"
        if stop.budget_usd is not None and cost is not None and k > 0:
            # Stop while the next steps still fit, keeping a margin for what is billed after
            # the stop (final replicas, merge, evaluation).
            per_step = cost["total_usd"] / (k + 1)
            if would_exceed(cost["total_usd"] + 2 * per_step, stop.budget_usd):
                return "budget"
        return None

    def _scale(self, k: int, nxt: int, elapsed: float, loss: float, epoch: float, trainers: list[int],
               directive: dict) -> list[int]:
        """Ask the policy; put its decision in step ``nxt``'s directive; return the fleet after it."""
        from ebb.autotune.policies import pick_eviction

        self.policy.observe(k, elapsed, loss, len(self.members), epoch)
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
                self.scale_events.append({**event, "action": "evict", "worker": w, "recent_loss": self.recent_loss.get(w)})
            after = [w for w in trainers if w not in evict]
            directive["evict"] = evict
        elif decision.action == "join":
            donor = trainers[0]
            joined = list(range(self.next_id, self.next_id + decision.count))
            self.next_id += decision.count
            after = sorted(trainers + joined)
            directive["donors"] = [donor]
            for w in joined:
                self.started_at[w] = time.monotonic()
                # It starts after barrier ``nxt``, from the donor's replica as of that barrier.
                self.launcher.launch(WorkerStart(worker=w, members=list(after), step=nxt + 1,
                                                 cursor=self.cursor + len(trainers), donor_blob=replica_blob(donor, nxt)))
                self.scale_events.append({**event, "action": "join", "worker": w, "donor": donor})
        directive["members"] = list(after)
        return after

    def _autotune_summary(self) -> dict | None:
        """What the auto-tuner saw: its knee and every interval's s_Δ (why it did or did not evict)."""
        tuner = getattr(self.policy, "tuner", None)
        if tuner is None:
            return None
        return {"knee_step": tuner.knee_step, "tolerance": tuner.tolerance, "decisions": tuner.decisions}

    # -- the end -------------------------------------------------------------------
    def merged_replica(self) -> dict[str, np.ndarray]:
        """Average of the final replicas of the active workers (DESIGN §1 step 3)."""
        total: dict[str, np.ndarray] | None = None
        for w in self.members:
            blob = self.updates.get_blob(final_blob(w))
            if blob is None:
                raise EngineError(f"worker {w} finished without its final replica")
            arrays = decode_batch(blob)
            if total is None:
                total = {n: a.astype(np.float64) for n, a in arrays.items()}
            else:
                for n, a in arrays.items():
                    total[n] += a
        assert total is not None
        return {n: (a / len(self.members)).astype(np.float32) for n, a in total.items()}

    def evaluate(self, replica: dict[str, np.ndarray]) -> dict[str, float]:
        model = build_model(self.spec.model, self.manifest, self.spec.hyper, self.spec.seed)
        for n, p in model.params.items():
            p.copy_(torch.from_numpy(replica[n]))
        if not self.manifest.test.parts:
            return {}
        cache = PartCache(self.objects, self.manifest, model, split="test", capacity=1)
        return model.evaluate(cache.get(i) for i in range(len(self.manifest.test.parts)))

    def _finish(self) -> dict:
        replica = self.merged_replica()
        test_metrics = self.evaluate(replica)
        self.finished_at = time.monotonic()
        wall = self.elapsed()
        self.totals.worker_seconds = self.worker_seconds()
        sync = sorted(self.sync_samples)
        report = {
            "status": self.stop_reason,
            "wall_seconds": wall,
            "steps": self.clock + 1,
            "epochs": round(self.cursor / self.num_parts, 4),
            "final_loss": self.history[-1]["loss"] if self.history else None,
            "loss_name": self.loss_name,
            "test_metrics": test_metrics,
            "workers": {"initial": self.spec.workers, "final": len(self.members)},
            "history": self.history,
            "totals": self.totals.as_dict(),
            "sync_overhead_ms": {"median": 1000 * sync[len(sync) // 2], "p90": 1000 * sync[int(len(sync) * 0.9)],
                                 "samples": len(sync), "first_worker_median": self._first_worker_median(),
                                 "released_late": self.released_late} if sync else None,
            "scale_events": self.scale_events,
            "autotune": self._autotune_summary(),
            "eval_seconds": round(self.eval_seconds, 4),
            "time_to_target_test": self.test_hit,
        }
        cost = self.cost()
        if cost is not None:
            report["cost"] = cost
            report["perf_per_dollar"] = perf_per_dollar(wall, cost["total_usd"]) if cost["total_usd"] > 0 else None
        self.replica = replica
        self.sink.close(report)
        return report
