"""The names a deployment and its runtime share (docs/AWS.md), in one place.

`stacks/` builds the stack from these names and the handlers, the stores and the CLI read
them, so a grant, a variable or a metric cannot drift from the code that uses it. The
standard library only: `stacks/` imports this module without the engine's dependencies.
"""

from __future__ import annotations

from types import MappingProxyType

from ebb.ports.keys import PROGRESS_KEY, REPORT_KEY  # under a job's `out`: what `ebb watch` shows; its report

# -- the data bucket ------------------------------------------------------------------
# Top-level prefixes (docs/AWS.md "Object keys").
DATASETS = "datasets/"  # prepared datasets: Prepare, `ebb prepare --out s3://…`, `ebb submit`
RAW = "raw/"  # raw input files for Prepare: the user, `ebb submit`
JOBS = "jobs/"  # per job: the normalised spec, its outputs, progress and abort marker
CHECKPOINTS = "checkpoints/"  # per job: each round's checkpoints (expired by a lifecycle rule)
SCRATCH = "scratch/"  # per job: signal payloads sent by pointer (expired by a lifecycle rule)
PREDICTIONS = "predictions/"  # per predict run: its shards and manifest (`ebb predict --stack`)
TUNES = "tunes/"  # per search (`ebb tune --stack`): its state, tune.json and best/

SPEC_FILE = "spec.json"
ABORT_FILE = "abort.json"  # the abort marker: the job has failed or was stopped


def job_prefix(job_id: str) -> str:
    """Where a job's files live (and its outputs, unless its spec names another `out` under jobs/)."""
    return f"{JOBS}{job_id}"


def spec_key(job_id: str) -> str:
    return f"{job_prefix(job_id)}/{SPEC_FILE}"


def abort_key(job_id: str) -> str:
    return f"{job_prefix(job_id)}/{ABORT_FILE}"


def checkpoints_prefix(job_id: str) -> str:
    return f"{CHECKPOINTS}{job_id}"


def scratch_prefix(job_id: str) -> str:
    return f"{SCRATCH}{job_id}"


def tune_prefix(tune_id: str) -> str:
    """Where a search's state, leaderboard and best trial live (docs/AWS.md "Tuning on AWS")."""
    return f"{TUNES}{tune_id}"


TUNE_STATE_FILE = "state.json"  # under a search's prefix


def tune_state_key(tune_id: str) -> str:
    """A search's state between its steps; OnFailure reads which job a stopped pack was training."""
    return f"{tune_prefix(tune_id)}/{TUNE_STATE_FILE}"


# What each function writes, as object-key patterns (IAM wildcards; `*` spans `/`). The
# stack grants exactly these (stacks/compute.py) and nothing else: PutObject on `put`,
# DeleteObject on `delete`. Every function reads the whole bucket.
PUT = MappingProxyType(
    {
        "worker": (f"{CHECKPOINTS}*", f"{SCRATCH}*"),
        "supervisor": (f"{CHECKPOINTS}*", f"{SCRATCH}*", f"{JOBS}*/{PROGRESS_KEY}"),
        "prepare": (f"{DATASETS}*",),
        "finalize": (f"{JOBS}*",),  # report.json, model.npz, loss.png, progress.json under `out`
        "validate": (f"{JOBS}*/{SPEC_FILE}",),
        "on_failure": (f"{JOBS}*",),  # the failed report.json, progress.json, the abort marker
        "predict": (f"{PREDICTIONS}*",),  # a predict run's shards and manifest
        # a search's state, tune.json and best/; a trial's report, its share of its packs added
        "tune": (f"{TUNES}*", f"{JOBS}*/{REPORT_KEY}"),
    }
)
DELETE = MappingProxyType(
    {
        "worker": (f"{CHECKPOINTS}*", f"{SCRATCH}*"),  # old rounds' checkpoints, payloads read
        "supervisor": (f"{CHECKPOINTS}*", f"{SCRATCH}*"),
        "prepare": (f"{DATASETS}*",),  # the old manifest and stale parts of a dataset prepared again
        "finalize": (f"{CHECKPOINTS}*",),  # a finished job's checkpoints
    }
)
FUNCTIONS = tuple(PUT)  # by handler module: ebb.aws.handlers.<name>.handler (tune: ebb.tune.handler)

# -- environment variables (set by the stack, read in ebb/aws/config.py and the stores) --
BUCKET_ENV = "EBB_BUCKET"
REDIS_URLS_ENV = "EBB_REDIS_URLS"
REDIS_CLUSTER_ENV = "EBB_REDIS_CLUSTER"
REDIS_SECRET_ENV = "EBB_REDIS_SECRET_ARN"
CONTROL_TOPIC_ENV = "EBB_CONTROL_TOPIC_ARN"
SUPERVISOR_QUEUE_ENV = "EBB_SUPERVISOR_QUEUE_URL"
WORKER_QUEUE_PREFIX_ENV = "EBB_WORKER_QUEUE_URL_PREFIX"
MAX_WORKERS_ENV = "EBB_MAX_WORKERS"
EVENTS_TOPIC_ENV = "EBB_EVENTS_TOPIC_ARN"
METRICS_NAMESPACE_ENV = "EBB_METRICS_NAMESPACE"
# Validate's: what the deployment runs a job on (JSON: memory, architecture, cache, concurrency).
DEPLOYMENT_ENV = "EBB_DEPLOYMENT"
SERVICE_NAME_ENV = "POWERTOOLS_SERVICE_NAME"


def service_name(function: str) -> str:
    """POWERTOOLS_SERVICE_NAME of a function (`on_failure` → `ebb-on-failure`)."""
    return "ebb-" + function.replace("_", "-")


# -- metrics (embedded metric format; docs/AWS.md "Metrics") -----------------------------
METRICS_NAMESPACE = "Ebb"
JOB_DIMENSION = "JobId"
JOB_METRICS = (
    "Loss",
    "TestMetric",
    "ActiveWorkers",
    "StepSeconds",
    "ComputeSeconds",
    "CommSeconds",
    "WaitSeconds",
    "BytesExchanged",
    "SentFraction",
    "CostUsd",
)

# -- queues, topics and events -----------------------------------------------------------
FILTER_ATTRIBUTE = "worker"  # the control topic's message attribute worker queues filter on
BROADCAST = "all"  # ... whose value every worker queue accepts
EVENT_ATTRIBUTE = "event"  # the events topic's message attribute: JOB_FINISHED or JOB_FAILED
JOB_FINISHED, JOB_FAILED = "job.finished", "job.failed"


def worker_queue_prefix(stack_name: str) -> str:
    """The names of a stack's worker queues start with this (`Ebb-worker-`)."""
    return f"{stack_name}-worker-"


def worker_queue_name(prefix: str, worker: int) -> str:
    """Worker `worker`'s queue: a name or URL prefix + three digits."""
    return f"{prefix}{worker:03d}"


def worker_filter_policy(worker: int) -> dict[str, list[str]]:
    """The filter policy of worker `worker`'s subscription to the control topic."""
    return {FILTER_ATTRIBUTE: [str(worker), BROADCAST]}


# -- the state machine ---------------------------------------------------------------------
# An execution's input is the job spec; these fields beside it steer the execution and are
# not part of the spec (Validate takes them out): the job id whose spec, outputs and
# checkpoints to use (default: the execution's name; a trial's executions share one),
# `resume` (carry on from the checkpoints' last complete round) and `pause_after_steps`
# (end the rounds once the job's steps reach it, with no Finalize: 0 never pauses), and
# `pack` (`{"tune_id", "pack"}`: the job is one of a trial pack's, which asks the search for
# its next job when this one ends; docs/AWS.md "Tuning on AWS").
JOB_ID_FIELD, RESUME_FIELD, PAUSE_FIELD, PACK_FIELD = "job_id", "resume", "pause_after_steps", "pack"
CONTROL_FIELDS = (JOB_ID_FIELD, RESUME_FIELD, PAUSE_FIELD, PACK_FIELD)
VALIDATE, PREPARE, ROUND, FINALIZE, ON_FAILURE = "Validate", "Prepare", "Round", "Finalize", "OnFailure"
SUPERVISOR_STATE, WORKERS_STATE, WORKER_STATE = "Supervisor", "Workers", "Worker"
PAUSED = "Paused"  # the state that ends an execution at its pause_after_steps
# A trial pack's loop in the training machine: after a job's Paused or Finalize, NextJob asks
# the search (the tune function) for the pack's next job, which Validate then starts.
IN_PACK_STATE, NEXT_JOB_STATE, PACK_DONE_STATE, PACK_WAIT_STATE = "InPack?", "NextJob", "PackDone", "WaitForJob"
# A pack with no job now while another pack's trains waits this long before it asks again.
PACK_POLL_S = 10
EXECUTION = "Execution"  # OnFailure's failed_state for an execution stopped by hand or timed out
# Inline Map runs at most about 40 iterations at once, whatever MaxConcurrency says: more
# workers than this need the Distributed Map (a child execution per worker).
INLINE_MAP_LIMIT = 40
# A Standard execution's history holds at most 25,000 events; past it the execution fails.
HISTORY_LIMIT = 25_000
# Events a round adds to the execution's history: the Parallel, the supervisor's task, the
# Choice and the Map's own (ROUND_EVENTS), and with an inline Map each worker's iteration
# and task (EVENTS_PER_INLINE_WORKER; a Distributed Map's children keep their own histories).
ROUND_EVENTS = 24
EVENTS_PER_INLINE_WORKER = 8
JOB_EVENTS = 40  # Validate, Prepare, Finalize or OnFailure, and the execution's own

# -- the Predict state machine (`ebb predict --stack`; docs/AWS.md "Predicting") ------------
PLAN_STATE, SHARDS_STATE, SHARD_STATE, MANIFEST_STATE = "Plan", "Shards", "ScoreShard", "WriteManifest"
PREDICT_DIMENSION = "PredictRun"
PREDICT_METRICS = ("RowsScored", "RowsSkipped", "ShardSeconds")


# -- the Tune state machine (`ebb tune --stack`; docs/AWS.md "Tuning on AWS") ---------------
# The Map runs one nested training execution per fleet (a trial pack each).
ASK_STATE, TRIALS_STATE, TRIAL_STATE, TELL_STATE, CONCLUDE_STATE = "Ask", "Packs", "Pack", "Tell", "Conclude"
TUNE_DIMENSION = "TuneId"
TUNE_METRICS = ("TrialsStarted", "TrialsFinished", "BestValidation")


def predict_prefix(run: str) -> str:
    """Where a predict run's shards and manifest go."""
    return f"{PREDICTIONS}{run}"


# -- stack outputs (read by `ebb submit`, `ebb watch`, `ebb report`) -------------------------
STATE_MACHINE_OUTPUT = "StateMachineArn"
BUCKET_OUTPUT = "DataBucketName"
EVENTS_TOPIC_OUTPUT = "EventsTopicArn"
DASHBOARD_NAME_OUTPUT = "DashboardName"
DASHBOARD_URL_OUTPUT = "DashboardUrl"
PREDICT_STATE_MACHINE_OUTPUT = "PredictStateMachineArn"  # read by `ebb predict --stack`
TUNE_STATE_MACHINE_OUTPUT = "TuneStateMachineArn"  # read by `ebb tune --stack`
