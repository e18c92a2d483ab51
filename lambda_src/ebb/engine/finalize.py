"""Finalize (docs/ARCHITECTURE.md, "A job", step 3): merge the final replicas (or take the
best one validation kept), score the test split, write the report, the model (with
``model.json``, ``ebb.engine.artifact``) and the plot. A step of its own, after the last
round, so no supervisor round pays for it (on AWS it is its own function).
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from ebb.catalogue import entry
from ebb.cost.meter import meter_for
from ebb.cost.model import perf_per_dollar
from ebb.data.format import decode_batch
from ebb.engine import checkpoint
from ebb.engine.accounting import job_account
from ebb.engine.artifact import write_artifact
from ebb.engine.errors import EngineError
from ebb.engine.outputs import write_outputs
from ebb.engine.parts import PartCache, prime_for_scoring
from ebb.engine.replica import copy_replica
from ebb.engine.state import SupervisorState
from ebb.models import auto_hyper, build_model
from ebb.ports.keys import BEST_META_KEY, BEST_REPLICA_KEY, worker_key
from ebb.ports.manifest import load_manifest
from ebb.ports.objects import ObjectStore
from ebb.spec import JobSpec


def merged_replica(checkpoints: ObjectStore, round_: int, workers: list[int]) -> dict[str, np.ndarray]:
    """Average of the final replicas of the workers that trained to the end."""
    total: dict[str, np.ndarray] | None = None
    for w in workers:
        meta, arrays = checkpoint.read_worker(checkpoints, worker_key(round_, w))
        if meta["outcome"] != "stopped":
            raise EngineError(f"worker {w}'s last checkpoint is {meta['outcome']!r}, not its final replica")
        params = {k[6:]: a for k, a in arrays.items() if k.startswith("param.")}
        if total is None:
            total = {n: a.astype(np.float64) for n, a in params.items()}
        else:
            for n, a in params.items():
                total[n] += a
    if total is None:
        raise EngineError("no worker finished the job: nothing to merge")
    return {n: (a / len(workers)).astype(np.float32) for n, a in total.items()}


def evaluate(spec: JobSpec, data: ObjectStore, replica: dict[str, np.ndarray]) -> dict[str, float]:
    """The model's metrics on the test split ({} when there is none)."""
    manifest = load_manifest(data, spec.data)
    if not manifest.test.parts:
        return {}
    model = build_model(spec.model, manifest, spec.hyper, spec.seed)
    copy_replica(model, replica)
    prime_for_scoring(data, manifest, model)
    return model.evaluate(PartCache(data, manifest, model, split="test", max_bytes=0).each())


def best_replica(checkpoints: ObjectStore) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The best replica early stopping kept (and what it scored), or None."""
    try:
        meta = json.loads(checkpoints.get(BEST_META_KEY))
    except KeyError:
        return None
    return decode_batch(checkpoints.get(BEST_REPLICA_KEY)), meta


def cpu_per_worker_step(state: SupervisorState) -> dict[str, Any]:
    """The CPU of a worker-step by phase (ms, the mean over every worker's steps) and the
    busiest worker's CPU per step (ms, the mean over steps): the issue-28 table of any job."""
    steps, n = state.clock + 1, state.totals.worker_steps
    return {
        "cpu_ms_per_worker_step": {k: round(1000 * v / n, 4) for k, v in sorted(state.cpu_timing.items())} if n else {},
        "busiest_cpu_ms_per_step": round(1000 * state.totals.cpu_critical_seconds / steps, 4) if steps > 0 else None,
    }


def build_report(
    spec: JobSpec,
    state: SupervisorState,
    test_metrics: dict[str, float],
    finalize_seconds: float,
    output_puts: int = 3,
) -> dict[str, Any]:
    """report.json from the supervisor's final state (see the README for every field;
    ``output_puts``: the outputs written with it, as ``cost.meter.JobAccount`` prices them)."""
    o = state.overheads
    # Attempts at a round that were restarted (faults) ran, and were paid for, but their
    # state was thrown away: their time joins the job's (on the host clock, which they ran on).
    restarted_s = sum(float(f.get("attempt_seconds", 0.0)) for f in state.faults)
    restarted_worker_s = sum(float(f.get("attempt_seconds", 0.0)) * int(f.get("workers", 0)) for f in state.faults)
    sync, firsts = sorted(o.sync_samples), sorted(o.sync_first)
    totals = state.totals.model_dump()
    sent_nnz, local_nnz = totals.pop("sent_nnz"), totals.pop("local_nnz")
    totals.update(
        {
            "worker_seconds": round(state.worker_seconds + restarted_worker_s, 3),
            "cpu_seconds": round(totals["cpu_seconds"], 3),
            "cpu_critical_seconds": round(totals["cpu_critical_seconds"], 3),
            "sent_fraction": sent_nnz / local_nnz if local_nnz else 0.0,
            "timing_seconds": {k: round(v, 4) for k, v in sorted(state.timing.items())},
            "cpu_timing_seconds": {k: round(v, 4) for k, v in sorted(state.cpu_timing.items())},
            **cpu_per_worker_step(state),
        }
    )
    history = state.history
    wall = state.elapsed + (restarted_s if spec.clock.kind == "host" else 0.0)
    account = job_account(
        state,
        wall_seconds=wall,
        worker_seconds=state.worker_seconds + restarted_worker_s,
        rounds=state.round + 1,
        output_puts=output_puts,
    )
    cost = meter_for(spec)(account)
    hit = state.stop.target_hit
    return {
        "status": state.stop.reason,
        "wall_seconds": wall,
        "steps": state.clock + 1,
        "epochs": history[-1]["epoch"] if history else 0.0,
        "rounds": state.round + 1,
        "clock": spec.clock.model_dump(mode="json") if spec.clock.kind == "fleet" else {"kind": "host"},
        "host_seconds": round(state.host_elapsed, 4),
        "final_loss": history[-1]["loss"] if history else None,
        "loss_name": entry(spec.model).loss_name,
        "test_metrics": test_metrics,
        "workers": {"initial": spec.workers, "final": len(state.members)},
        "history": history,
        "totals": totals,
        "sync_overhead_ms": {
            "median": 1000 * sync[len(sync) // 2],
            "p90": 1000 * sync[int(len(sync) * 0.9)],
            "samples": len(sync),
            "first_worker_median": 1000 * firsts[len(firsts) // 2] if firsts else None,
            "released_late": o.released_late,
        }
        if sync
        else None,
        "supervisor_ms_per_step": _quantiles(o.handling_ms),
        "scale_events": state.scale_events,
        "faults": state.faults,
        "autotune": state.autotune,
        "eval_seconds": round(o.eval_seconds, 4),
        "time_to_target_val": hit.model_dump() if hit else None,
        "finalize_seconds": round(finalize_seconds, 3),
        "cost": cost,
        "perf_per_dollar": perf_per_dollar(wall, cost["total_usd"]) if wall > 0 and cost["total_usd"] > 0 else None,
        "model": "merged",
        "spec": spec.model_dump(mode="json"),
    }


def failure_report(spec: JobSpec, state: SupervisorState, error: str, *, failed_in_round: int) -> dict[str, Any]:
    """A ``failed`` report of a job as far as ``state`` got: the cause, steps, history."""
    report = build_report(spec, state, {}, 0.0)
    # No model is written for a failed job: the report must not say there is one.
    report.update({"status": "failed", "error": error, "failed_in_round": failed_in_round, "model": None})
    report.pop("finalize_seconds", None)
    return report


def _quantiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    v = sorted(values)
    return {"median": v[len(v) // 2], "p90": v[int(len(v) * 0.9)], "max": v[-1], "steps": len(v)}


def finalize(
    spec: JobSpec, *, data: ObjectStore, checkpoints: ObjectStore, out: ObjectStore
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Merge, score and write the outputs of a finished job; returns (report, model)."""
    started = time.perf_counter()
    done = checkpoint.latest(checkpoints)
    if done is None or not done["finished"]:
        raise EngineError("the job has not finished its last round: nothing to finalize")
    state = checkpoint.read_supervisor(checkpoints, done["round"])
    best = best_replica(checkpoints)
    replica = best[0] if best else merged_replica(checkpoints, done["round"], state.members)
    test_metrics = evaluate(spec, data, replica)
    report = build_report(spec, state, test_metrics, time.perf_counter() - started)
    manifest = load_manifest(data, spec.data)
    # The defaults the data decided (PMF's l2 when unset): the spec says only "auto".
    report["auto_hyper"] = auto_hyper(spec.model, manifest, spec.hyper)
    if best:  # the model written is the best one validation saw, not the last
        meta = best[1]
        report.update(
            {"model": "best", "best_step": meta["step"], "best_epoch": meta["epoch"], "best_val": meta["value"]}
        )
    artifact = write_artifact(out, data, spec, manifest, report, replica)
    write_outputs(out, report, replica, extra=artifact)
    return report, replica
