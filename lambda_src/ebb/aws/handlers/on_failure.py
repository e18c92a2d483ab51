"""OnFailure: a ``failed`` report saying which state failed and why, and a "job failed" event.

First it sets the job's abort marker: any invocation of the job still running (a round's
supervisor and workers, which Step Functions stops waiting for but does not stop) returns
within seconds and writes no more progress. A zip function (no numpy): it writes the
report as JSON itself, keeping what the job had done — steps, rounds and history up to
the last complete round, and the progress written since.
"""

from __future__ import annotations

import json
import time

from aws_lambda_powertools import Logger

from ebb.aws.config import aws_config
from ebb.aws.contract import FailureEvent, FailureResult
from ebb.aws.jobs import Job, job_of_execution
from ebb.aws.notify import publish_job_event
from ebb.engine import checkpoint
from ebb.ports import deployment as names
from ebb.ports.keys import PROGRESS_KEY, REPORT_KEY

logger = Logger(service="ebb-on-failure")


def describe(failed_state: str, error: str, cause: str) -> str:
    """One line: the state, the exception type and its message (Lambda puts them in Cause)."""
    try:
        doc = json.loads(cause)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and ("errorMessage" in doc or "errorType" in doc):
        return f"{failed_state} failed: {doc.get('errorType') or error}: {doc.get('errorMessage', '')}".rstrip(": ")
    return f"{failed_state} failed: {error}: {cause}".rstrip(": ")


@logger.inject_lambda_context
def handler(event: dict, context) -> dict:
    req = FailureEvent.model_validate(event)
    config = aws_config()
    if req.execution_input is not None:  # a stopped execution: its job may be named in its input
        req.job_id = job_of_execution(req.job_id, req.execution_input, Job.bucket_store(config))
    logger.append_keys(job_id=req.job_id)
    message = describe(req.failed_state, req.error.Error, req.error.Cause)
    report: dict = {"status": "failed", "error": message, "failed_state": req.failed_state}
    report_key = None
    key = req.spec_key or (req.job_id and names.spec_key(req.job_id))
    if req.job_id and Job.bucket_store(config).exists(key):  # else Validate never stored the job: nothing runs
        job = Job.load(config, req.job_id, key)
        job.abort(message)
        report.update(_progress_so_far(job))
        report["spec"] = job.spec.model_dump(mode="json")
        job.out.put(REPORT_KEY, json.dumps(report, indent=2, default=str).encode())
        job.write_progress({"state": "failed", "error": message, "updated_at": time.time()})
        report_key = f"{job.spec.out_location.rstrip('/')}/{REPORT_KEY}"
    publish_job_event(config, names.JOB_FAILED, req.job_id or "(not started)", {"error": message, "report": report_key})
    logger.error("job failed", extra={"failed_state": req.failed_state, "error": message})
    return FailureResult(report_key=report_key).model_dump()


def _progress_so_far(job: Job) -> dict:
    """Steps, rounds and history of the last complete round, and the latest progress."""
    out: dict = {}
    done = checkpoint.latest(job.checkpoints)
    if done is not None:
        state = checkpoint.read_supervisor(job.checkpoints, done["round"])
        out.update(
            {
                "steps": state.clock + 1,
                "rounds": done["round"] + 1,
                "history": state.history,
                "scale_events": state.scale_events,
                "wall_seconds": state.elapsed,
            }
        )
    try:
        out["last_progress"] = json.loads(job.out.get(PROGRESS_KEY))
    except KeyError:
        pass
    return out
