"""One job of one trial, in a process of its own: train a trial's job (``trial.json`` in its
folder) up to a step, over the search's shared redis-server, then stop at that round's end.

    python -m ebb.tune.trial TRIAL_DIR --to-steps N --redis URL [--budget-usd X]

The first job of a trial starts it; every later one resumes from the trial's last complete
round (``run_local(resume=True)``), so a promoted trial carries on exactly where it paused.
At the last rung the engine's own ``stop.max_epochs`` ends the job and it is finalized as
any job is (report, model, plot). Exit 0 when the job paused or finished, 1 when it failed
(its failed report is written, as ``ebb train`` writes one).

Also here: what a trial's checkpoints say (``outcome``), and ``close`` — the report and
model of a trial the search stopped between rungs.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ebb.spec import JobSpec

TRIAL_SPEC = "trial.json"


def load_trial(folder: str) -> JobSpec:
    from pathlib import Path

    return JobSpec.model_validate_json((Path(folder) / TRIAL_SPEC).read_text())


def run_job(folder: str, to_steps: int, redis_url: str, budget_usd: float | None, warm: bool = False) -> int:
    """``warm``: the job runs in a trial pack (``ebb.tune.runner``), on a fleet that is up
    already: no cold start (the pack paid it), priced as the pack's (``cost.meter.packed``)."""
    import torch

    from ebb.engine import checkpoint
    from ebb.engine.outputs import write_outputs
    from ebb.local.runner import JobFailed, checkpoints_location, run_local
    from ebb.stores import open_object_store

    spec = load_trial(folder)
    store = open_object_store(checkpoints_location(spec))
    done = checkpoint.latest(store)
    resume = done is not None
    first = checkpoint.read_supervisor(store, done["round"]).clock + 1 if done is not None else 0
    # One round to the rung (a round is one wave of invocations: one cold start on a fleet),
    # unless round_seconds cuts it sooner; the search pauses the trial where it ends.
    rounds = spec.round_steps or max(2, to_steps - first)
    stop = spec.stop.model_copy(update={"budget_usd": budget_usd})
    spec = spec.model_copy(update={"redis_urls": [redis_url], "stop": stop, "round_steps": rounds})
    if warm:
        spec = spec.model_copy(update={"clock": spec.clock.model_copy(update={"cold_start_s": 0.0})})
    torch.set_num_threads(1)
    started = time.monotonic()
    try:
        run_local(spec, None, resume=resume, pause_after=lambda result: result["steps"] >= to_steps)
    except JobFailed as exc:
        report = exc.report
        report["wall_seconds"] = report.get("wall_seconds") or round(time.monotonic() - started, 3)
        report["spec"] = spec.model_dump(mode="json")
        write_outputs(open_object_store(spec.out_location), report, None)
        print(f"trial failed: {exc}", file=sys.stderr)
        return 1
    return 0


def warm_fleet(spec: JobSpec) -> dict[str, float] | None:
    """A trial pack's start: load the training split once, as each of its warm functions
    would (``engine.parts.warm_up``); None when a function could not keep it."""
    from ebb.engine.parts import warm_up
    from ebb.models import build_model
    from ebb.ports.manifest import load_manifest
    from ebb.stores import open_object_store

    data = open_object_store(spec.data)
    manifest = load_manifest(data, spec.data)
    model = build_model(spec.model, manifest, spec.hyper, spec.seed)
    return warm_up(data, manifest, model, spec.aws.part_cache_bytes())


def outcome(spec: JobSpec, unit_steps: int, store=None) -> dict[str, Any]:
    """A trial's state from its checkpoints (``store``; default: where a local run keeps
    them): epochs (one worker's pace), best validation, cost and time so far, status
    (``paused`` between rungs, else the engine's stop reason) and its validation curve."""
    from ebb.engine import checkpoint
    from ebb.local.runner import checkpoints_location
    from ebb.stores import open_object_store

    if store is None:
        store = open_object_store(checkpoints_location(spec))
    done = checkpoint.latest(store)
    if done is None:
        return {"epochs": 0.0, "best_val": None, "cost_usd": 0.0, "wall_seconds": 0.0, "status": "failed", "curve": []}
    state = checkpoint.read_supervisor(store, done["round"])
    history = state.history
    # The best scoring so far as the scoring worker kept it: at a rung's end (a round's last
    # step) its scoring has not reached the supervisor yet (it goes with the next report).
    best = best_replica_meta(store)
    _fold_pending_scoring(spec, store, done, state)
    history = state.history
    return {
        "epochs": (state.clock + 1) / unit_steps,
        "best_val": best["value"] if best else None,
        "cost_usd": history[-1]["cost_usd"] if history else 0.0,
        "wall_seconds": state.elapsed,
        "status": (state.stop.reason or "finished") if done["finished"] else "paused",
        "curve": [[round((h["step"] + 1) / unit_steps, 4), h["val"]] for h in history if h.get("val") is not None],
    }


def last_rung_passes(last_rung: int, unit_steps: int, spec: JobSpec, num_parts: int) -> float:
    """``stop.max_epochs`` of a trial's job: its last rung (epochs at one worker's pace) in
    passes over the data by the whole fleet. The engine itself stops the trial there (and
    finalizes it as any job); each earlier job ends its last round at its rung."""
    return last_rung * unit_steps * spec.workers / num_parts


def _fold_pending_scoring(spec: JobSpec, store, done: dict[str, Any], state) -> None:
    """Put the scoring made at the last round's last step (carried in the scoring worker's
    checkpoint, not reported yet) into ``state``'s history, as its next round would."""
    from ebb.catalogue import entry
    from ebb.engine import checkpoint
    from ebb.engine.errors import CheckpointError
    from ebb.ports.keys import worker_key

    if not state.members:
        return
    try:
        meta, _ = checkpoint.read_worker(store, worker_key(done["round"], min(state.members)))
    except CheckpointError:
        return
    scoring = meta.get("scoring")
    if scoring and scoring["step"] < len(state.history):
        state.history[scoring["step"]][scoring["split"]] = scoring["metrics"][entry(spec.model).loss_name]


def best_replica_meta(store) -> dict[str, Any] | None:
    import json

    from ebb.ports.keys import BEST_META_KEY

    try:
        return json.loads(store.get(BEST_META_KEY))
    except KeyError:
        return None


def close(spec: JobSpec, status: str, outputs: bool = True, store=None) -> dict[str, Any]:
    """Report a trial the search left between rungs as a finished job's report is written
    (its best model scored on the test split, the plot), with ``status``; its checkpoints stay,
    so a later promotion could still resume it. ``outputs`` False: the report alone (a pack's
    pruned trial: no model or plot written, nor paid for; its checkpoints hold the model).
    ``store``: its checkpoints (default: where a local run keeps them)."""
    from ebb.engine import checkpoint
    from ebb.engine.finalize import best_replica, build_report, evaluate, merged_replica
    from ebb.engine.outputs import write_outputs, write_report_only
    from ebb.local.runner import checkpoints_location
    from ebb.stores import open_object_store

    started = time.perf_counter()
    if store is None:
        store = open_object_store(checkpoints_location(spec))
    data = open_object_store(spec.data)
    done = checkpoint.latest(store)
    assert done is not None, "a closed trial has trained a rung"
    state = checkpoint.read_supervisor(store, done["round"])
    _fold_pending_scoring(spec, store, done, state)
    best = best_replica(store)
    replica = best[0] if best else merged_replica(store, done["round"], state.members)
    puts = 3 if outputs else 1
    report = build_report(spec, state, evaluate(spec, data, replica), time.perf_counter() - started, puts)
    report["status"] = status
    if best:
        meta = best[1]
        report.update(
            {"model": "best", "best_step": meta["step"], "best_epoch": meta["epoch"], "best_val": meta["value"]}
        )
    if outputs:
        write_outputs(open_object_store(spec.out_location), report, replica)
    else:
        write_report_only(open_object_store(spec.out_location), report)
    return report


def main(argv: list[str] | None = None) -> int:
    from ebb.local.redis_server import die_with_parent

    die_with_parent()  # a search killed outright takes its trials with it; --resume reruns them
    p = argparse.ArgumentParser(prog="python -m ebb.tune.trial", description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--to-steps", type=int, required=True)
    p.add_argument("--redis", required=True)
    p.add_argument("--budget-usd", type=float)
    args = p.parse_args(argv)
    return run_job(args.folder, args.to_steps, args.redis, args.budget_usd)


if __name__ == "__main__":
    sys.exit(main())
