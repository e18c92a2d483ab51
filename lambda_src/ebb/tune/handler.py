"""Tune: one step of the Tune state machine (``action``: ask, tell or conclude); the work is
``ebb.tune.stack``. Ask and Tell put TrialsStarted, TrialsFinished and BestValidation
(EMF, dimension TuneId) for the dashboard's Tuning row.

It lives in ``ebb.tune`` (not ``ebb.aws.handlers``): the search sits above the AWS layer.

- ask ``{"tune_id", "search": the execution's input}`` -> ``{"done", "jobs": [{"trial",
  "rung", "name", "input"}], "max_concurrency"}``
- tell ``{"tune_id", "results": [{"trial", "rung", "ok", "error"?}]}`` -> the summary
- conclude ``{"tune_id"}`` -> ``{"tune_key", "best_trial", "best_val"}``
"""

from __future__ import annotations

from dataclasses import asdict

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from ebb.aws.config import aws_config
from ebb.aws.deployment import account_settings
from ebb.ports import deployment as names
from ebb.tune.stack import RESULT_FILE, StackTune, max_concurrency

logger = Logger(service="ebb-tune")


@logger.inject_lambda_context
def handler(event: dict, context) -> dict:
    action, tune_id = event.get("action"), event["tune_id"]
    logger.append_keys(tune_id=tune_id, action=action)
    config = aws_config()
    if action == "ask":
        run = StackTune.load(config, tune_id, event.get("search"))
        jobs = run.ask()
        workers = max((j.input["workers"] for j in jobs), default=1)
        summary = run.summary()
        _put(config, tune_id, {"TrialsStarted": sum(1 for j in jobs if j.rung == 0)})
        logger.info("asked", extra={"jobs": [(j.trial, j.rung) for j in jobs], **summary})
        return {
            "done": not jobs,
            "jobs": [asdict(j) for j in jobs],
            "max_concurrency": max_concurrency(workers, account_settings()),
        }
    run = StackTune.load(config, tune_id)
    if action == "tell":
        before = run.summary()["trials_finished"]
        run.tell(event["results"])
        summary = run.summary()
        counts = {"TrialsFinished": summary["trials_finished"] - before}
        _put(config, tune_id, counts, best=summary["best_val"])
        logger.info("told", extra=summary)
        return summary
    if action == "conclude":
        result = run.conclude()
        best = result["best"]
        return {
            "tune_key": f"{names.tune_prefix(tune_id)}/{RESULT_FILE}",
            "best_trial": best and best["trial"],
            "best_val": best and best["best_val"],
        }
    raise ValueError(f"unknown action {action!r}: expected ask, tell or conclude")


def _put(config, tune_id: str, counts: dict[str, int], best: float | None = None) -> None:
    metrics = Metrics(namespace=config.metrics_namespace, service="")
    metrics.add_dimension(names.TUNE_DIMENSION, tune_id)
    for name, value in counts.items():
        metrics.add_metric(name, MetricUnit.Count, value)
    if best is not None:
        metrics.add_metric("BestValidation", MetricUnit.NoUnit, best)
    metrics.flush_metrics()
