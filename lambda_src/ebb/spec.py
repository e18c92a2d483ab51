"""The job specification: one validated document that says everything a job does.

Written as YAML by users (``ebb train job.yaml``), overridden by CLI flags, and carried
verbatim in ``report.json``. Unknown keys and out-of-range values fail with one line
that names the file, the line and the field.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

ModelName = Literal["pmf", "sparse_lr", "lr"]

# Defaults per model that train well on standard data (MovieLens-100k, Criteo samples)
# without tuning; a field left unset in the spec takes the value for its model.
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "pmf": {"rank": 20, "lr": 0.04, "momentum": 0.8, "l2": 0.05, "init_std": 0.1, "lr_decay": 0.9},
    "sparse_lr": {"lr": 0.02, "l2": 1e-6, "lr_decay": 1.0},
    "lr": {"lr": 0.05, "l2": 1e-5, "lr_decay": 1.0},
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class HyperParams(_Strict):
    """Model and optimiser settings; unset ones take the per-model default."""

    rank: int | None = Field(None, ge=1, le=1024, description="PMF latent dimension")
    lr: float | None = Field(None, gt=0, le=100, description="learning rate")
    momentum: float | None = Field(None, ge=0, lt=1, description="Nesterov momentum (PMF)")
    l2: float | None = Field(None, ge=0, description="L2 regularisation")
    init_std: float | None = Field(None, gt=0, le=10, description="std of the initial factors (PMF)")
    lr_decay: float | None = Field(None, gt=0, le=1, description="learning-rate factor applied each epoch")


class SyncSpec(_Strict):
    mode: Literal["bsp", "ssp", "isp"] = "isp"
    significance: float = Field(0.7, ge=0, description="ISP threshold v; v_t = v / sqrt(t); 0 is BSP")
    slack: int = Field(3, ge=0, le=1000, description="SSP staleness bound s")
    quantize: bool = Field(True, description="ISP (v > 0): send significant values as int8 with a per-row scale; "
                                            "the rounding error stays pending (error feedback)")


class StopSpec(_Strict):
    target_loss: float | None = Field(None, gt=0, description="stop when the training loss is at or below this")
    patience: int = Field(10, ge=1, description="consecutive steps at or below target_loss")
    target_test: float | None = Field(None, gt=0, description="stop when the test metric (RMSE / log-loss) is at or below this")
    eval_every: int = Field(0, ge=0, description="evaluate the test split every N steps (0: only at the end; 50 with target_test)")
    max_epochs: float = Field(10, gt=0)
    max_seconds: float = Field(3600, gt=0)
    budget_usd: float | None = Field(None, gt=0, description="stop before the estimated cost exceeds this")


class ScheduleEntry(_Strict):
    epoch: float = Field(ge=0)
    workers: int = Field(ge=1)


class ScalingSpec(_Strict):
    policy: Literal["autotune", "none", "schedule"] = "autotune"
    min_workers: int = Field(1, ge=1)
    interval_s: float = Field(20, gt=0, description="scheduling interval T")
    horizon_s: float = Field(10, gt=0, description="look-ahead horizon Δ (≤ T)")
    tolerance: float = Field(0.02, ge=0, le=1, description="evict when s_Δ(t) < tolerance")
    knee_tolerance: float = Field(0.1, gt=0, description="knee: slope flatter than this share of the steepest")
    knee_patience: int = Field(5, ge=1)
    schedule: list[ScheduleEntry] = Field(default_factory=list)
    scale_lr: bool = Field(True, description="below the initial fleet P, scale the learning rate by p/P")

    @model_validator(mode="after")
    def _check(self):
        if self.horizon_s > self.interval_s:
            raise ValueError(f"horizon_s ({self.horizon_s}) must be ≤ interval_s ({self.interval_s})")
        if self.policy == "schedule" and not self.schedule:
            raise ValueError("policy 'schedule' needs a non-empty 'schedule' list")
        return self


class AwsSpec(_Strict):
    """The configuration the job would have on AWS: used by the cost model."""

    memory_mb: int = Field(1769, ge=128, le=10240, description="Lambda memory per worker")
    supervisor_memory_mb: int = Field(512, ge=128, le=10240)
    arch: Literal["x86_64", "arm64"] = "x86_64"
    cache_node_type: str = "cache.t4g.medium"
    cache_nodes: int = Field(1, ge=1)
    signal_channel: Literal["redis", "sns_sqs"] = "redis"


class JobSpec(_Strict):
    name: str = Field(default_factory=lambda: f"job-{uuid.uuid4().hex[:8]}", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    model: ModelName = "pmf"
    data: str = Field(description="prepared dataset folder (from `ebb prepare`)")
    out: str | None = Field(None, description="output folder; default runs/<name>")
    seed: int = 0
    workers: int = Field(1, ge=1, le=256)
    hyper: HyperParams = Field(default_factory=HyperParams)
    sync: SyncSpec = Field(default_factory=SyncSpec)
    stop: StopSpec = Field(default_factory=StopSpec)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    aws: AwsSpec = Field(default_factory=AwsSpec)
    redis_urls: list[str] = Field(default_factory=list, description="existing Redis servers; empty: start a private one")
    round_seconds: float = Field(840, gt=0, description="Lambda round length before checkpoint-and-resume")

    @model_validator(mode="after")
    def _fill_defaults(self):
        for key, value in MODEL_DEFAULTS[self.model].items():
            if getattr(self.hyper, key) is None:
                setattr(self.hyper, key, value)
        if self.scaling.min_workers > self.workers:
            self.scaling.min_workers = self.workers
        if self.stop.target_test is not None and self.stop.eval_every == 0:
            self.stop.eval_every = 50
        if self.sync.mode == "ssp" and self.scaling.policy != "none" and self.workers > 1:
            raise ValueError("scaling.policy must be 'none' with sync.mode 'ssp' (workers change only at a barrier)")
        return self

    @property
    def out_dir(self) -> Path:
        return Path(self.out) if self.out else Path("runs") / self.name


class SpecError(ValueError):
    """A job spec problem, already phrased as ``file:line: field: what is wrong``."""


def _key_lines(text: str) -> dict[tuple, int]:
    """Map each mapping key path in a YAML document to its 1-based line."""
    lines: dict[tuple, int] = {}

    def walk(node, path):
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                p = path + (key.value,)
                lines[p] = key.start_mark.line + 1
                walk(value, p)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[path + (i,)] = item.start_mark.line + 1
                walk(item, path + (i,))

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    return lines


def _set_path(doc: dict, dotted: str, value: Any) -> None:
    node = doc
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


def load_spec(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> JobSpec:
    """Read a YAML job file (optional), apply ``{"dotted.field": value}`` overrides, validate."""
    text, source = "", "<flags>"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise SpecError(f"{path}: cannot read job file: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text) if text else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise SpecError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise SpecError(f"{source}:1: a job file is a mapping of fields, got {type(doc).__name__}")
    lines = _key_lines(text) if text else {}
    overridden = set()
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_path(doc, dotted, value)
            overridden.add(tuple(dotted.split(".")))
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(job)"
        if loc in overridden:
            where = "command line"
        else:
            line = next((lines[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in lines), None)
            where = f"{source}:{line}" if line else source
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        raise SpecError(f"{where}: {field}: {msg}") from None
