"""What travels on a signal channel: worker reports up, supervisor directives down.

Every channel (in-memory, Redis, SNS/SQS) carries the same declared types in one
encoding, compact JSON with full field names; the Redis barrier scripts
(``stores/redis_store.py``) read the same names: ``kind``, ``step``, ``worker``,
``members``, ``sent_bytes`` and ``sent_at`` of a step report, and ``step`` and
``trainers`` of a staged directive. A message that does not parse is an error naming the
message, never a silent default.

Times that cross processes (``sent_at``, ``last_sent_at``) are wall-clock seconds
since the epoch: a monotonic clock means nothing in another process or machine.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class MessageError(ValueError):
    """A message on a signal channel that is not one of the declared types."""


class _Message(BaseModel):
    # A diverging loss is NaN or infinite and must arrive as such (JSON's NaN/Infinity
    # tokens, which Python and Redis's cjson both read), not as null.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class Scoring(_Message):
    """A worker's scoring of its replica on the held-out split: the validation split, or
    the test split standing in when the data has none (docs/ARCHITECTURE.md,
    "Validation and early stopping")."""

    step: int = Field(description="the step after which the replica was scored")
    split: Literal["val", "test"]
    epoch: float
    metrics: dict[str, float] = Field(description="the model's metrics on the split (its loss name among them)")
    seconds: float = Field(0.0, description="how long the scoring took")


class StepReport(_Message):
    """A worker has computed (and, if it sent anything, published) its update of ``step``."""

    kind: Literal["step"] = "step"
    worker: int
    step: int
    members: list[int] = Field(description="the workers training this step: the barrier opens when all have reported")
    round: int = 0
    loss_sum: float
    samples: int
    empty: bool = Field(description="nothing significant to send (ISP): peers need not read this worker")
    sent_bytes: int
    sent_nnz: int
    local_nnz: int
    read_bytes: int = Field(description="bytes of peers' updates read since the last report")
    applied_upto: int = Field(description="every step up to this one is applied to this worker's replica")
    position: int = Field(description="the position in the minibatch sequence this step trained on")
    cpu_seconds: float = Field(description="process time since the last report, test scoring excluded")
    io_cpu_seconds: float = Field(0.0, description="the part of cpu_seconds spent inside the update store's calls")
    sync_seconds: float | None = Field(None, description="last announcement of the previous step -> this worker's go")
    sent_at: float = Field(description="wall time of the announcement")
    object_gets: int = 0
    requests: int = Field(0, description="update-store round trips since the last report (announce and go included)")
    timing: dict[str, float] = Field(default_factory=dict, description="wall seconds per phase")
    cpu_timing: dict[str, float] = Field(default_factory=dict, description="CPU seconds per phase (training thread)")
    scoring: Scoring | None = Field(None, description="a held-out scoring done since the last report")


class EndReport(_Message):
    """A worker's last report of a round: it stopped, was evicted, checkpointed, or failed."""

    kind: Literal["end"] = "end"
    worker: int
    step: int = Field(description="the last step applied to its replica")
    round: int = 0
    outcome: Literal["stopped", "evicted", "unfinished", "failed"]
    checkpoint: str | None = Field(None, description="checkpoint key (stopped, unfinished)")
    error: str | None = Field(None, description="why it failed: the exception, in one line")
    read_bytes: int = 0
    cpu_seconds: float = 0.0
    object_gets: int = 0
    timing: dict[str, float] = Field(default_factory=dict)
    cpu_timing: dict[str, float] = Field(default_factory=dict)
    pending_nnz: int = 0


Report = StepReport | EndReport


class Directive(_Message):
    """The supervisor's word on one step, delivered when every trainer has announced it."""

    step: int
    round: int = 0
    stop: bool = False
    round_end: int | None = Field(None, description="the round's last step: checkpoint after applying it")
    evict: list[int] = Field(default_factory=list, description="leave after this step, publishing the replica")
    donors: list[int] = Field(default_factory=list, description="publish the replica after this step for joiners")
    members: list[int] | None = Field(None, description="the fleet from the next step on, when it changes")
    # Added by the channel as it delivers: whose updates exist for the step, and when
    # the last announcement was made (for the barrier's overhead).
    senders: list[int] | None = None
    last_sent_at: float | None = None


_REPORT: TypeAdapter[Report] = TypeAdapter(Annotated[Report, Field(discriminator="kind")])
_LIST_FIELDS = ("senders", "evict", "donors", "members")


def encode(message: BaseModel) -> str:
    """The one wire form of every message: compact JSON with full field names."""
    return message.model_dump_json(exclude_none=True)


def _load(raw: str | bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, TypeError) as exc:
        raise MessageError(f"malformed {what} {_clip(raw)}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise MessageError(f"malformed {what} {_clip(raw)}: not a JSON object")
    for name in _LIST_FIELDS:  # Lua's cjson writes an empty list as {}
        if doc.get(name) == {}:
            doc[name] = []
    return doc


def decode_report(raw: str | bytes) -> Report:
    doc = _load(raw, "report")
    try:
        return _REPORT.validate_python(doc)
    except ValidationError as exc:
        raise MessageError(f"malformed report {_clip(raw)}: {_first_error(exc)}") from None


def decode_directive(raw: str | bytes) -> Directive:
    doc = _load(raw, "directive")
    try:
        return Directive.model_validate(doc)
    except ValidationError as exc:
        raise MessageError(f"malformed directive {_clip(raw)}: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "(message)"
    return f"{field}: {err['msg']}"


def _clip(raw: str | bytes, n: int = 160) -> str:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return repr(text if len(text) <= n else text[:n] + "…")
