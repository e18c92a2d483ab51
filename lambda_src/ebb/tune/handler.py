"""Tune: one step of the Tune state machine, or of a trial pack's execution of the training
machine (``action``: ask, next, tell or conclude); the work is ``ebb.tune.stack``. Ask, Next
and Tell put TrialsStarted, TrialsFinished and BestValidation (EMF, dimension TuneId) for
the dashboard's Tuning row.

It lives in ``ebb.tune`` (not ``ebb.aws.handlers``): the search sits above the AWS layer.

- ask ``{"tune_id", "search": the execution's input}`` -> ``{"done", "packs": [{"pack",
  "name", "input"}], "max_concurrency"}`` (a pack's execution each, its first job's input)
- next ``{"tune_id", "pack", "job_id"}`` (a pack's job ended well, or a poll after a wait)
  -> ``{"done", "wait", "input"}`` (the pack's next job; or wait and ask again: another
  pack's job may end in a promotion; or done: the pack ends)
- tell ``{"tune_id", "results": [{"pack", "ok", "error"?}]}`` (the packs' executions ended)
  -> the summary
- conclude ``{"tune_id"}`` -> ``{"tune_key", "best_trial", "best_val"}``
"""

from __future__ import annotations

from dataclasses import asdict

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from ebb.aws.config import aws_config
from ebb.aws.deployment import account_settings
from ebb.ports import deployment as names
from ebb.tune.stack import RESULT_FILE, StackTune

logger = Logger(service="ebb-tune")


@logger.inject_lambda_context
def handler(event: dict, context) -> dict:
    action, tune_id = event.get("action"), event["tune_id"]
    logger.append_keys(tune_id=tune_id, action=action)
    config = aws_config()
    if action == "ask":
        account = account_settings()
        asked = StackTune.step(config, tune_id, lambda r: (r.summary(), r.ask(account)), event.get("search"))
        run, (before, packs) = asked
        _put(config, tune_id, {"TrialsStarted": run.summary()["trials_started"] - before["trials_started"]})
        logger.info("asked", extra={"packs": [p.pack for p in packs], **run.summary()})
        return {"done": not packs, "packs": [asdict(p) for p in packs], "max_concurrency": max(1, len(packs))}
    if action == "next":
        pack = int(event["pack"])
        run, (before, step) = StackTune.step(
            config, tune_id, lambda r: (r.summary(), r.next(pack, event.get("job_id")))
        )
        summary = run.summary()
        counts = {
            "TrialsStarted": summary["trials_started"] - before["trials_started"],
            "TrialsFinished": summary["trials_finished"] - before["trials_finished"],
        }
        _put(config, tune_id, counts, best=summary["best_val"])
        job = step.get("input")
        logger.info("next", extra={"pack": pack, "ended": event.get("job_id"), "next": job and job["job_id"], **step})
        return {"done": bool(step.get("done")), "wait": bool(step.get("wait")), "input": job}
    if action == "tell":

        def tell(run: StackTune) -> dict[str, object]:
            before = run.summary()
            run.tell(event["results"])
            return before

        run, before = StackTune.step(config, tune_id, tell)
        summary = run.summary()
        counts = {"TrialsFinished": summary["trials_finished"] - before["trials_finished"]}
        _put(config, tune_id, counts, best=summary["best_val"])
        logger.info("told", extra=summary)
        return summary
    if action == "conclude":
        result = StackTune.load(config, tune_id).conclude()
        best = result["best"]
        return {
            "tune_key": f"{names.tune_prefix(tune_id)}/{RESULT_FILE}",
            "best_trial": best and best["trial"],
            "best_val": best and best["best_val"],
        }
    raise ValueError(f"unknown action {action!r}: expected ask, next, tell or conclude")


def _put(config, tune_id: str, counts: dict[str, int], best: float | None = None) -> None:
    metrics = Metrics(namespace=config.metrics_namespace, service="")
    metrics.add_dimension(names.TUNE_DIMENSION, tune_id)
    for name, value in counts.items():
        metrics.add_metric(name, MetricUnit.Count, value)
    if best is not None:
        metrics.add_metric("BestValidation", MetricUnit.NoUnit, best)
    metrics.flush_metrics()
