"""The supervisor's state: everything one round hands the next, and what finalize and the
failure report read (docs/ARCHITECTURE.md, "Rounds and checkpoints").

Declared once, here, as typed models: the supervisor works on them, ``state_dict()`` is
what a round saves and ``load_state_dict()`` what the next one reads. Light on purpose
(pydantic, no numpy or torch): the on_failure zip function reads it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ebb.engine.errors import CheckpointError
from ebb.ports.messages import Directive
from ebb.spec import JobSpec

StopReason = Literal["converged", "early_stopped", "max_epochs", "max_time", "budget"]


class _State(BaseModel):
    # A diverging loss is NaN and must survive the round trip as such.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class Totals(_State):
    """What the workers did, summed over the job (``report.json``'s ``totals``)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    updates_sent: int = 0
    empty_steps: int = 0  # steps where a worker had nothing significant to send
    sent_nnz: int = 0  # values ISP sent ...
    local_nnz: int = 0  # ... of the values the workers' updates touched
    object_gets: int = 0
    reports: int = 0
    cpu_seconds: float = 0.0  # the workers' process time, scoring excluded
    cpu_critical_seconds: float = 0.0  # per step the busiest worker's, summed
    worker_steps: int = 0  # step reports counted (the divisor of the CPU per worker-step)


class Best(_State):
    """The best validation scoring so far, and how many scorings since have not beaten it."""

    value: float
    step: int
    epoch: float | None = None
    since: int = 0


class TargetHit(_State):
    """The first held-out scoring at or below ``stop.target_val`` (``time_to_target_val``)."""

    step: int
    time: float
    seconds_excluding_eval: float
    metric: str
    value: float


class StopState(_State):
    """The stop rules' memory (``engine/stopping.py`` decides with it)."""

    reason: StopReason | None = None
    step: int | None = None  # the step whose directive says stop
    at_target: int = 0  # consecutive steps with the training loss at stop.target_loss
    best: Best | None = None
    target_hit: TargetHit | None = None


class Overheads(_State):
    """What synchronising cost: the barrier's wait, the supervisor's own work, scoring."""

    sync_samples: list[float] = Field(default_factory=list)  # per worker step: last announcement -> its go (s)
    sync_first: list[float] = Field(default_factory=list)  # per step: the quickest worker's (s)
    handling_ms: list[float] = Field(default_factory=list)  # per closed step: the supervisor's work (ms)
    released_late: int = 0  # steps whose directive came after the last announcement
    eval_seconds: float = 0.0  # held-out scorings, summed


class FleetTime(_State):
    """The fleet clock's time and billed worker-seconds (``clock.kind: fleet``)."""

    time: float = 0.0
    worker_seconds: float = 0.0


class SupervisorState(_State):
    """The whole of what a job's supervisor knows between rounds."""

    job: str
    round: int = -1  # the round that saved this state (-1: none yet)
    finished: bool = False
    mode: str  # the sync mode the workers run
    clock: int = -1  # the last closed step
    cursor: int = 0  # the minibatch sequence's position after the last closed step
    members: list[int]  # who trained the last closed step
    upcoming: list[int]  # who trains the next one
    next_id: int  # the id a joining worker gets
    held: Directive | None = None  # the next step's directive, decided and not yet released
    elapsed: float = 0.0  # the job's time (the fleet clock's, or the host's)
    host_elapsed: float = 0.0  # this machine's time, either way
    fleet: FleetTime | None = None
    worker_seconds: float = 0.0
    worker_invocations: int = 0
    checkpoint_puts: int = 0
    directives: int = 0
    history: list[dict[str, Any]] = Field(default_factory=list)  # report.json's history[]
    scale_events: list[dict[str, Any]] = Field(default_factory=list)
    faults: list[dict[str, Any]] = Field(default_factory=list)  # rounds run again, and why
    totals: Totals = Field(default_factory=Totals)
    timing: dict[str, float] = Field(default_factory=dict)  # seconds per phase, summed over workers
    cpu_timing: dict[str, float] = Field(default_factory=dict)  # CPU seconds per phase, summed over workers
    stop: StopState = Field(default_factory=StopState)
    recent_loss: dict[int, float] = Field(default_factory=dict)  # per worker, an EWMA of its step losses
    overheads: Overheads = Field(default_factory=Overheads)
    policy: dict[str, Any] | None = None  # the scaling policy's own state
    autotune: dict[str, Any] | None = None  # what the auto-tuner saw (report.json's autotune)

    @classmethod
    def initial(cls, spec: JobSpec) -> SupervisorState:
        """The state before the first round."""
        members = list(range(spec.workers))
        return cls(
            job=spec.name,
            mode=spec.effective_sync_mode,
            members=members,
            upcoming=list(members),
            next_id=spec.workers,
            held=Directive(step=0),
        )

    def state_dict(self) -> dict[str, Any]:
        """The state as JSON-able data (what a round saves)."""
        return self.model_dump(mode="json")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take over a saved state (validated: a malformed one is an error naming the field)."""
        loaded = type(self).model_validate(state)
        for name in type(self).model_fields:
            setattr(self, name, getattr(loaded, name))

    def check_resumes(self, spec: JobSpec, round_: int) -> None:
        """That round ``round_`` of ``spec``'s job may start from this state (else CheckpointError)."""
        if self.job != spec.name:
            raise CheckpointError(f"the checkpoint belongs to job {self.job}, not {spec.name}")
        if self.mode != spec.effective_sync_mode:
            raise CheckpointError(
                f"the job's checkpoints were written under sync mode {self.mode} but the job "
                f"now runs {spec.effective_sync_mode}"
            )
        if self.round != round_ - 1:
            raise CheckpointError(f"round {round_} needs the state of round {round_ - 1}, found round {self.round}'s")
