"""Predict: one step of the Predict state machine (plan, a shard, the manifest); the work is
``ebb.predict.shards``. Each shard reports RowsScored, RowsSkipped and ShardSeconds
(EMF, dimension PredictRun) for the dashboard."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from ebb.aws.config import aws_config
from ebb.ports import deployment as names
from ebb.predict import shards

logger = Logger(service="ebb-predict")


@logger.inject_lambda_context
def handler(event: dict, context) -> dict:
    action = event.get("action")
    logger.append_keys(run=event.get("run"), action=action, shard=event.get("index"))
    config = aws_config()
    if action == "plan":
        return shards.plan({**event, "max_shards": config.max_workers})
    if action == "shard":
        result = shards.score_shard(event, config.bucket)
        metrics = Metrics(namespace=config.metrics_namespace, service="")
        metrics.add_dimension(names.PREDICT_DIMENSION, event["run"])
        metrics.add_metric("RowsScored", MetricUnit.Count, result["rows"])
        metrics.add_metric("RowsSkipped", MetricUnit.Count, result["skipped_rows"])
        metrics.add_metric("ShardSeconds", MetricUnit.Seconds, result["seconds"])
        metrics.flush_metrics()
        logger.info("shard scored", extra={"rows": result["rows"], "seconds": result["seconds"]})
        return result
    if action == "manifest":
        return shards.write_manifest(event, config.bucket, int(context.memory_limit_in_mb))
    raise ValueError(f"unknown action {action!r}: expected plan, shard or manifest")
