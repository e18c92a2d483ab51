"""What the supervisor shows while a job runs on AWS: CloudWatch metrics in embedded
metric format (powertools Metrics; docs/AWS.md "Metrics") and a small ``progress.json``
for ``ebb watch``. Both are written every few steps, never per worker step. Once the job's
abort marker is set (it failed, or was stopped) the progress is left as OnFailure wrote it."""

from __future__ import annotations

import time

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from ebb.aws.jobs import Job
from ebb.ports import deployment as names

FLUSH_EVERY_STEPS = 10
FLUSH_EVERY_S = 10.0
_COMPUTE = ("fetch", "compute", "filter", "apply")
_COMM = ("write", "read")


class CloudWatchSink:
    """A supervisor's metrics sink on Lambda: EMF metrics with the ``JobId`` dimension."""

    def __init__(self, job: Job, *, every_steps: int = FLUSH_EVERY_STEPS, every_s: float = FLUSH_EVERY_S):
        # service="" keeps powertools from adding a `service` dimension: the dashboard
        # selects the metrics by JobId alone.
        self.metrics = Metrics(namespace=job.config.metrics_namespace, service="")
        self.job, self.every_steps, self.every_s = job, every_steps, every_s
        self.pending: list[dict] = []
        self.last: dict | None = None
        self._last_time: float | None = None
        self._flushed_at = time.monotonic()

    def step(self, record: dict) -> None:
        self.pending.append(record)
        if (
            len(self.pending) >= self.every_steps
            or time.monotonic() - self._flushed_at >= self.every_s
            or record.get("stop")
        ):
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        m = self.metrics
        m.add_dimension(names.JOB_DIMENSION, self.job.job_id)
        for r in self.pending:
            m.add_metric("Loss", MetricUnit.NoUnit, r["loss"])
            m.add_metric("ActiveWorkers", MetricUnit.Count, r["workers"])
            m.add_metric("BytesExchanged", MetricUnit.Bytes, r["bytes_sent"] + r["bytes_received"])
            m.add_metric("SentFraction", MetricUnit.NoUnit, r["sent_fraction"])
            m.add_metric("CostUsd", MetricUnit.NoUnit, r["cost_usd"])
            if self._last_time is not None:
                m.add_metric("StepSeconds", MetricUnit.Seconds, max(0.0, r["time"] - self._last_time))
            self._last_time = r["time"]
            timing = r.get("timing") or {}
            if timing:
                m.add_metric("ComputeSeconds", MetricUnit.Seconds, sum(timing.get(k, 0.0) for k in _COMPUTE))
                m.add_metric("CommSeconds", MetricUnit.Seconds, sum(timing.get(k, 0.0) for k in _COMM))
                m.add_metric("WaitSeconds", MetricUnit.Seconds, timing.get("wait", 0.0))
            if r.get("val") is not None:
                m.add_metric("TestMetric", MetricUnit.NoUnit, r["val"])
        m.add_metadata("model", self.job.spec.model)
        m.flush_metrics()
        self.last = self.pending[-1]
        if self.job.aborted() is None:  # a failed job's progress says "failed", not "running"
            shown = ("step", "time", "loss", "epoch", "workers", "round", "cost_usd")
            self.job.write_progress(
                {key: self.last[key] for key in shown if key in self.last}
                | {"state": "running", "updated_at": time.time()}
            )
        self.pending = []
        self._flushed_at = time.monotonic()

    def close(self, report: dict) -> None:
        self.flush()
