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

# Defaults per model that train well without tuning; a field left unset in the spec takes
# the value for its model. Chosen with bench/quality.py on MovieLens-shaped ratings
# (ml-100k, ml-latest-small) and Criteo-shaped rows against a tuned torch reference, and
# checked on the planted generators (README, "Picking hyper-parameters").
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "pmf": {"rank": 20, "lr": 0.02, "momentum": 0.8, "l2": 0.1, "init_std": 0.1, "lr_decay": 0.95},
    "sparse_lr": {"lr": 0.01, "l2": 3e-5, "lr_decay": 1.0},
    "lr": {"lr": 0.05, "l2": 1e-5, "lr_decay": 1.0},
}
# The optimiser each model trains with when hyper.optimizer is unset (PMF offers both), and
# the learning rate Adam takes when hyper.lr is unset: Adam's step is about lr per entry
# whatever the gradient's scale, so SGD's default lr means something else to it.
OPTIMIZER_DEFAULTS: dict[str, str] = {"pmf": "sgd_momentum", "sparse_lr": "adam", "lr": "adam"}
PMF_ADAM_LR = 0.03

# How a step's updates meet (sync.combine) when unset. mean: a row moves by the mean of
# its touchers' proposals, about one worker's step, so an epoch at P workers advances it
# about 1/P to 1 of one worker's epoch (PMF + SGD: summing 4 workers' momentum steps
# stopped improving at ml-latest-small-shaped val RMSE 0.834; the mean goes on to 0.830).
# sum: every proposal is added, as if the workers had taken their steps one after
# another, so an epoch does one worker's epoch of progress at any P. Sparse LR trains by Adam, whose proposal is a
# step of about lr whatever the gradient: the mean of P of them moved the features every
# worker sees (the signal) 1/P as far while a rare feature (one toucher) moved a full
# step, and 4 workers overfit sooner and worse (Criteo-shaped val log-loss 0.507, against
# 0.496 summed and 0.496 at one worker; bench/quality.py, docs/RESULTS.md).
COMBINE_DEFAULTS: dict[str, str] = {"pmf": "mean", "sparse_lr": "sum", "lr": "mean"}
# The sum's cap (sync.sum_cap) when unset: past this many touchers a row moves by this
# many times their mean. Uncapped, a feature all 24 workers saw took 24 Adam steps a step
# and sparse LR at lr 0.01 swung between log-loss 0.50 and 0.96 without converging (fleet
# clock, Criteo shape); 8 is the largest fleet whose plain sum converged under BSP. ISP
# at sparse LR's old v of 0.7 needed 4: its payloads carried several steps of a row's
# held-back proposals, and at 16 and 32 workers its log-loss swung and ended 1.6-3% worse
# than BSP's. At today's v (0.2) it holds little back and converges at 8, in 40 steps
# where capped at 4 it took 65 (docs/RESULTS.md, "Sync models and DDP").
DEFAULT_SUM_CAP = 8

# ISP's threshold v when unset. MLLess runs 0.7 end to end; for PMF its code uses 0.05. At
# 4 workers on ml-latest-small-shaped ratings, v 0.7 held PMF's validation RMSE at 0.8304
# where BSP reaches 0.8286; v 0.4 reaches 0.8288 (bench/quality_probe.py m4-v0.4-160) for
# more bytes than 0.7 and fewer than 0.2. Sparse LR (Criteo shape, fleet clock, sum capped
# at 8) reached log-loss 0.485 soonest at 0.2 of 0.1, 0.2 and 0.4 at 8 and 32 workers (0.1 by
# 2% at 16): 40 steps to BSP's 35 where 0.7 took 65 and, at 16+ workers, needed a cap of 4.
SIGNIFICANCE_DEFAULTS: dict[str, float] = {"pmf": 0.4, "sparse_lr": 0.2, "lr": 0.7}


# Share of the rows `ebb prepare` (and a job's `prepare` section) holds out for validation
# unless told otherwise: enough for early stopping to see a smooth curve on 100k ratings.
DEFAULT_VAL_FRACTION = 0.1


# stop.max_epochs when unset. With a validation split early stopping ends a job and this is
# a backstop, × the initial workers: at P workers an epoch does 1/P to 1 epochs of one
# worker's work under sync.combine mean (docs/ARCHITECTURE.md). Without one nothing
# watches for overfitting: then about the epochs after which each model's defaults stop
# improving at one worker on the bench's data, not scaled, as running short is safer than
# overfitting (sparse LR at 8 workers × 5 epochs, when it combined by the mean: log-loss
# 0.585; best 0.50).
MAX_EPOCHS_WITH_VAL = 100
MAX_EPOCHS_WITHOUT_VAL = {"pmf": 30, "sparse_lr": 5, "lr": 10}


class _Strict(BaseModel):
    # strict: `workers: true` is not 1 and `workers: 2.5` is not 2; no NaN or infinity in any field.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


class HyperParams(_Strict):
    """Model and optimiser settings; unset ones take the model's default (MODEL_DEFAULTS)."""

    rank: int | None = Field(None, ge=1, le=1024, description="PMF latent dimension")
    lr: float | None = Field(None, gt=0, le=100, description="learning rate")
    optimizer: Literal["sgd_momentum", "adam"] | None = Field(
        None, description=f"pmf: sgd_momentum | adam (lazy, lr {PMF_ADAM_LR:g}); LR: adam")
    momentum: float | None = Field(None, ge=0, lt=1, description="Nesterov momentum (PMF, sgd_momentum)")
    l2: float | None = Field(None, ge=0, description="L2 regularisation")
    init_std: float | None = Field(None, gt=0, le=10, description="std of the initial factors (PMF)")
    lr_decay: float | None = Field(None, gt=0, le=1, description="learning rate × this every epoch at one worker's "
                                     "pace (steps: minibatches, / workers under sync.combine sum)")


class SyncSpec(_Strict):
    """How the workers' updates meet (docs/ARCHITECTURE.md, "Synchronisation")."""

    mode: Literal["bsp", "ssp", "isp"] = Field("isp", description="bsp | ssp | isp")
    significance: float | None = Field(None, ge=0, description="ISP v: an entry is sent when |δ_i|/|x_i| > "
                                       "v/sqrt(t); 0 = BSP exactly (default: " + ", ".join(
                                           f"{m} {v:g}" for m, v in SIGNIFICANCE_DEFAULTS.items()) + ")")
    slack: int = Field(3, ge=0, le=1000, description="SSP: how many steps ahead of the slowest worker a worker "
                       "may run")
    quantize: bool = Field(True, description="ISP (v > 0): int8 values with a per-row scale; the rounding stays "
                           "pending")
    combine: Literal["mean", "sum"] | None = Field(
        None, description="a step moves a row by the mean of its touchers' proposals or by their sum (as if taken "
        "in turn); default " + ", ".join(
            f"{m} {c}" for m, c in COMBINE_DEFAULTS.items()))
    sum_cap: int = Field(DEFAULT_SUM_CAP, ge=1, le=10_000, description="combine sum: a row more than this many "
                         "workers touched in a step moves by this many times their mean (lower it to 4 for ISP with "
                         "a high v at 16+ workers)")


class StopSpec(_Strict):
    """When a job ends (the first rule that holds)."""

    target_loss: float | None = Field(None, gt=0, description="training loss (RMSE for pmf, log-loss for LR) at or "
                                      "below this ...")
    patience: int = Field(10, ge=1, description='... for this many consecutive steps: "converged"')
    target_test: float | None = Field(None, gt=0, description="or: the held-out metric (validation if the data has "
                                      'it, else test) at or below this: "converged"')
    eval_every: int | None = Field(None, ge=0, description="score the held-out split every N steps (default with a "
                                   "validation split: an epoch at one worker's pace, as lr_decay; 50 with target_test; "
                                   "0: never)")
    patience_evals: int = Field(5, ge=1, description='validation: no better for this many scorings: "early_stopped"')
    min_delta: float = Field(1e-4, ge=0, description="... where better means lower by this share at least")
    max_epochs: float | None = Field(None, gt=0, description="passes over the training data (default: "
                                     f"{MAX_EPOCHS_WITH_VAL} × workers with a validation split, where early "
                                     "stopping ends a job first; without one " + ", ".join(
                                         f"{m} {n}" for m, n in MAX_EPOCHS_WITHOUT_VAL.items()) + ")")
    max_seconds: float = Field(3600, gt=0, description="job time, across rounds")
    budget_usd: float | None = Field(None, gt=0, description="stop before the estimated AWS cost would pass this")


class ScheduleEntry(_Strict):
    epoch: float = Field(ge=0)
    workers: int = Field(ge=1)


class ScalingSpec(_Strict):
    """How the fleet changes as the model converges (docs/ARCHITECTURE.md, "auto-tuner")."""

    policy: Literal["autotune", "none", "schedule"] = Field("autotune", description="autotune (MLLess scale-in) | "
                                                            "none | schedule")
    min_workers: int = Field(1, ge=1, description="never fewer workers than this")
    interval_s: float = Field(20, gt=0, description="T: how often the auto-tuner decides")
    horizon_s: float = Field(10, gt=0, description="Δ ≤ T: how far ahead it projects")
    tolerance: float = Field(0.02, ge=0, le=1, description="S: evict while the projected degradation s_Δ < S")
    knee_tolerance: float = Field(0.1, gt=0, description="knee: the smoothed slope is flatter than this share of "
                                  "the steepest ...")
    knee_patience: int = Field(5, ge=1, description="... for this many checks")
    knee_min_drop: float = Field(0.05, ge=0, lt=1, description="knee: not before the smoothed loss has fallen this "
                                 "share below its level after the warm-up (an early plateau is not the knee)")
    throughput_tolerance: float = Field(0.1, ge=0, le=1, description="evict only while the projected minibatches "
                                        "per second with one worker fewer stay within this share of the initial "
                                        "fleet's (1: off)")
    schedule: list[ScheduleEntry] = Field(default_factory=list, description="policy schedule: [{epoch: 2, workers: "
                                          "4}, ...] (locally also scale-out)")
    scale_lr: bool = Field(False, description="below the initial fleet P, learning rate × p/P (linear scaling "
                           "rule; sync.combine mean only)")

    @model_validator(mode="after")
    def _check(self):
        if self.horizon_s > self.interval_s:
            raise ValueError(f"horizon_s ({self.horizon_s}) must be ≤ interval_s ({self.interval_s})")
        if self.policy == "schedule" and not self.schedule:
            raise ValueError("policy 'schedule' needs a non-empty 'schedule' list")
        return self


class FaultSpec(_Strict):
    """What the job does when a worker dies or stalls, or the update store goes away."""

    worker_timeout_s: float = Field(10, gt=0, description="a worker with no heartbeat for this long is lost")
    startup_timeout_s: float = Field(120, gt=0, description="... before its first heartbeat of a round (process "
                                     "start, Lambda cold start)")
    on_worker_loss: Literal["evict", "restart_round", "fail"] = Field(
        "evict", description="evict (go on without it) | restart_round (from its checkpoints) | fail; SSP restarts")
    max_restarts: int = Field(3, ge=0, description="run rounds again at most this many times in a job")


class PrepareSpec(_Strict):
    """How to prepare ``data`` from a raw file when it holds no prepared dataset yet
    (the flags of ``ebb prepare``; on AWS the Prepare state runs it)."""

    format: Literal["movielens", "criteo", "libsvm", "csv"]
    input: str = Field(description="raw input: a local file, s3://bucket/key, or (on AWS) a key in the data bucket")
    test_input: str | None = Field(None, description="a separate test file (else test_fraction of the input)")
    batch_size: int = Field(6250, ge=1, description="rows per minibatch (MLLess: 6,250)")
    test_fraction: float = Field(0.1, ge=0, lt=1, description="share of the rows held out for test")
    val_fraction: float = Field(DEFAULT_VAL_FRACTION, ge=0, lt=1, description="share held out as a validation "
                                "split (early stopping; 0: none)")
    seed: int = Field(0, description="the shuffle's seed")
    skip_bad_rows: bool = Field(False, description="count and skip malformed rows instead of stopping")
    num_features: int = Field(100_000, ge=1, description="hashing-trick dimension (criteo)")
    numeric_scaling: Literal["log", "minmax"] = Field("log", description="criteo integer columns: log | minmax")


class AwsSpec(_Strict):
    """What a local run is priced at (cost model); on a stack, Validate sets these from the deployment.

    A deployed job runs on the functions and cache the stack was deployed with (cdk.json's
    ebb: keys): their memory, architecture and cache replace these fields in its spec, so
    its cost is always priced from what runs. The defaults are cdk.json's."""

    memory_mb: int = Field(1769, ge=128, le=10240, description="Lambda memory per worker (1769 MB = one vCPU)")
    supervisor_memory_mb: int = Field(1024, ge=128, le=10240, description="the supervisor's")
    part_cache_mb: int | None = Field(None, ge=0, description="minibatches a worker keeps decoded in memory "
                                      "(default: a quarter of memory_mb; 0: none)")
    arch: Literal["x86_64", "arm64"] = Field("x86_64", description="x86_64 | arm64")
    cache_node_type: str = Field("cache.t4g.medium", description="the cache's node type")
    cache_nodes: int = Field(1, ge=1, description="and its nodes")
    signal_channel: Literal["redis", "sns_sqs"] = Field("redis", description="redis | sns_sqs (one job at a time "
                                                        "per deployment)")


    def part_cache_bytes(self) -> int:
        """A worker's budget for decoded minibatches, in bytes."""
        mb = self.memory_mb // 4 if self.part_cache_mb is None else self.part_cache_mb
        return mb << 20


class ClockSpec(_Strict):
    """Which clock the job runs on: host time, or the modelled time of a fleet (docs/ARCHITECTURE.md, "Fleet clock")."""

    kind: Literal["host", "fleet"] = Field("host", description="host (this machine's time) | fleet (a step = the "
                                           "barrier's release + the slowest worker's CPU, its I/O overlapping its "
                                           "bytes / link, + requests × rtt)")
    link_mb_s: float = Field(75.0, gt=0, description="fleet: one worker's link to the cache, MB/s (Lambda, measured)")
    rtt_ms: float = Field(0.4, ge=0, description="fleet: one update-store request's round trip, ms (ElastiCache in "
                          "the VPC)")
    node_mb_s: float = Field(625.0, gt=0, description="fleet: the cache node's link, MB/s per direction, shared by "
                             "all workers (cache.t4g.medium: up to 5 Gbit/s)")
    cold_start_s: float = Field(3.0, ge=0, description="fleet: one cold start of a wave of workers (round start, "
                                "joiners): container image + imports")
    barrier_ms: float = Field(0.5, ge=0, description="fleet: the barrier's release beyond the round trips, ms: from "
                              "the last announcement to a waiting worker's go (the cache's script, its push, the "
                              "worker waking)")


class JobSpec(_Strict):
    """A training job: every field, with its default (``ebb spec`` prints them all)."""

    name: str = Field(default_factory=lambda: f"job-{uuid.uuid4().hex[:8]}", pattern=r"^[A-Za-z0-9_.-]{1,64}$",
                      description="outputs go to runs/<name> unless `out` is set (default: random)")
    model: ModelName = Field("pmf", description="pmf (ratings) | sparse_lr (Criteo, LibSVM) | lr (dense CSV)")
    data: str = Field(description="prepared dataset: a folder or s3://bucket/prefix (from `ebb prepare`)",
                      json_schema_extra={"example": "data/ratings"})
    prepare: PrepareSpec | None = Field(None, description="prepare `data` from a raw file first if it is not "
                                        "prepared: {format, input, batch_size, test_fraction, ...} as ebb prepare")
    out: str | None = Field(None, description="output folder or s3://bucket/prefix (default runs/<name>)")
    seed: int = Field(0, description="initial model and minibatch order")
    workers: int = Field(1, ge=1, le=256, description="workers at the start")
    hyper: HyperParams = Field(default_factory=HyperParams)
    sync: SyncSpec = Field(default_factory=SyncSpec)
    stop: StopSpec = Field(default_factory=StopSpec)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    aws: AwsSpec = Field(default_factory=AwsSpec)
    faults: FaultSpec = Field(default_factory=FaultSpec)
    clock: ClockSpec = Field(default_factory=ClockSpec)
    redis_urls: list[str] = Field(default_factory=list, description="locally: use these Redis servers (sharded) "
                                  "instead of starting one")
    round_seconds: float = Field(840, gt=0, description="training time per round, then checkpoint and resume in "
                                 "fresh processes (Lambda: also the function's timeout less a margin)")
    round_steps: int | None = Field(None, ge=2, description="at most this many steps per round (reproducible "
                                    "cuts; under SSP a round runs at least slack + 2)")

    @model_validator(mode="after")
    def _fill_defaults(self):
        default_optimizer = OPTIMIZER_DEFAULTS[self.model]
        if self.hyper.optimizer is None:
            self.hyper.optimizer = default_optimizer
        elif self.model != "pmf" and self.hyper.optimizer != default_optimizer:
            raise ValueError(f"hyper.optimizer: model {self.model} trains with {default_optimizer} only")
        if self.model == "pmf" and self.hyper.optimizer == "adam" and self.hyper.lr is None:
            self.hyper.lr = PMF_ADAM_LR
        if self.sync.combine is None:
            self.sync.combine = COMBINE_DEFAULTS[self.model]
        if self.sync.significance is None:
            self.sync.significance = SIGNIFICANCE_DEFAULTS[self.model]
        for key, value in MODEL_DEFAULTS[self.model].items():
            if getattr(self.hyper, key) is None:
                setattr(self.hyper, key, value)
        if self.scaling.min_workers > self.workers:
            self.scaling.min_workers = self.workers
        if self.stop.target_test is not None and self.stop.eval_every is None:
            self.stop.eval_every = 50
        if self.sync.mode == "ssp" and self.scaling.policy != "none" and self.workers > 1:
            raise ValueError("scaling.policy must be 'none' with sync.mode 'ssp' (workers change only at a barrier)")
        return self

    def epoch_limit(self, has_val: bool) -> float:
        """``stop.max_epochs``, or its default for data with (or without) a validation split."""
        if self.stop.max_epochs is not None:
            return self.stop.max_epochs
        return MAX_EPOCHS_WITH_VAL * self.workers if has_val else MAX_EPOCHS_WITHOUT_VAL[self.model]

    @property
    def out_location(self) -> str:
        """Where the outputs go: a folder or ``s3://bucket/prefix`` (default runs/<name>)."""
        return self.out or str(Path("runs") / self.name)


def example_yaml() -> str:
    """Every field of a job file with its default and what it means, as YAML (``ebb spec``,
    the README): generated from the spec itself, so the two never disagree."""
    lines: list[str] = []
    per_model = "; ".join(f"{m}: " + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in d.items()) for m, d in MODEL_DEFAULTS.items())

    def add(text: str, note: str) -> None:
        if not note:
            lines.append(text)
        elif len(text) < 26 and 28 + len(note) <= 112:
            lines.append(f"{text:<26}# {note}")
        else:  # a long note goes on its own line, above
            lines.append(f"{' ' * (len(text) - len(text.lstrip()))}# {note}")
            lines.append(text)

    def emit(model: type[BaseModel], indent: str) -> None:
        for name, info in model.model_fields.items():
            value = info.get_default(call_default_factory=True)
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            value = "my-job" if name == "name" else extra.get("example", value)
            if isinstance(value, BaseModel):
                add(f"{indent}{name}:", (type(value).__doc__ or "").strip().splitlines()[0])
                if type(value) is HyperParams:
                    add(f"{indent}  # {per_model}", "")
                emit(type(value), indent + "  ")
                continue
            text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
            add(f"{indent}{name}: {text.removesuffix('...').strip()}", info.description or "")

    emit(JobSpec, "")
    return "\n".join(line.rstrip() for line in lines) + "\n"


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
    lines = _key_lines(text) if text else {}
    overridden = set()
    if isinstance(doc, dict):
        for dotted, value in (overrides or {}).items():
            if value is not None:
                _set_path(doc, dotted, value)
                overridden.add(tuple(dotted.split(".")))
    return parse_spec(doc, source, lines=lines, overridden=overridden)


def parse_spec(doc: Any, source: str, *, lines: dict[tuple, int] | None = None,
               overridden: set[tuple] | frozenset = frozenset()) -> JobSpec:
    """Validate a job document (a parsed YAML file, or a state machine's JSON input);
    a problem is a SpecError naming ``source`` (and the line, when known) and the field."""
    if not isinstance(doc, dict):
        raise SpecError(f"{source}:1: a job file is a mapping of fields, got {type(doc).__name__}")
    lines = lines or {}
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
