"""The declared events and results of every handler (docs/AWS.md, "Handler events").

Nothing large travels here: S3 keys, ids and counters only (Step Functions' 256 KB
state limit). A malformed event fails with the field it lacks.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore")  # Step Functions may pass more state than a handler reads


class ValidateEvent(_Event):
    spec: dict[str, Any]
    execution: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,80}$")


class JobRef(_Event):
    job_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,80}$")
    spec_key: str
    # In a trial pack: the supervisor and Finalize meter the job as the pack's
    # (``ebb.cost.meter.packed``), a worker keeps the training split warm between jobs.
    packed: bool = False


class PackRef(BaseModel):
    """A job trained in a trial pack (``ebb tune --stack``): the search and the pack."""

    model_config = ConfigDict(extra="forbid")

    tune_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,80}$")
    pack: int = Field(ge=0)


class JobControl(BaseModel):
    """The execution input's fields beside the job spec (``ebb.ports.deployment.CONTROL_FIELDS``):
    whose job this is, whether it carries on from its checkpoints, where it pauses."""

    model_config = ConfigDict(extra="forbid")

    job_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,80}$")
    resume: bool = False
    pause_after_steps: int = Field(0, ge=0)
    pack: PackRef | None = None


class ValidateResult(JobRef):
    prepare: bool
    round: int = 0
    workers: list[int]
    pause_after_steps: int = 0
    pack: PackRef | None = None  # carried in the state to every round and to the pack's NextJob


class PrepareResult(BaseModel):
    manifest_key: str
    train_parts: int
    train_rows: int
    val_rows: int = 0
    test_rows: int


class RoundEvent(JobRef):
    round: int = Field(ge=0)


class RoundResult(BaseModel):
    status: Literal["finished", "unfinished"]
    round: int
    workers: list[int]
    steps: int
    stop_reason: str | None


class WorkerEvent(RoundEvent):
    worker: int = Field(ge=0)


class WorkerResult(BaseModel):
    worker: int
    outcome: Literal["unfinished", "stopped", "evicted"]


class FinalizeResult(BaseModel):
    status: str
    report_key: str
    model_key: str


class StateError(_Event):
    Error: str = ""
    Cause: str = ""


class FailureEvent(_Event):
    job_id: str | None = None
    execution_input: str | None = None  # from the stopped-execution rule: the execution's input (JSON)
    spec_key: str | None = None
    failed_state: str = "unknown"
    error: StateError = Field(default_factory=StateError)


class FailureResult(BaseModel):
    status: Literal["failed"] = "failed"
    report_key: str | None
