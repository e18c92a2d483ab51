"""The job specification: one validated document that says everything a job does.

Written as YAML by users (``ebb train job.yaml``), overridden by CLI flags, and carried
verbatim in ``report.json``. Unknown keys and out-of-range values fail with one line
that names the file, the line and the field.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from ebb.catalogue import CATALOGUE, ModelName, entry, per_model, per_model_hyper

# stop.max_epochs when unset and the data has a validation split: a backstop, times the
# initial workers (at P workers an epoch does 1/P to 1 epochs of one worker's work under
# sync.combine mean), since early stopping ends a job first. Without a validation split
# each model's row of the catalogue says.
MAX_EPOCHS_WITH_VAL = 100
# stop.eval_every when unset and stop.target_val is set but the data has no validation
# split to score once an epoch.
EVAL_EVERY_WITH_TARGET = 50
# Fields renamed since earlier releases: a job file with the old name fails, naming the new.
RENAMED = {("stop", "target_test"): "stop.target_val"}


def shown(text: str) -> dict[str, Any]:
    """A field's default as ``ebb spec`` and ``--help`` show it, when the field's own default
    (None: "decided later") would say nothing."""
    return {"shown_default": text}


def default_text(info: FieldInfo) -> str:
    """What a field's default is, in words: its value, or the rule that decides it."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "shown_default" in extra:
        return str(extra["shown_default"])
    value = info.get_default(call_default_factory=True)
    if value is None or value == []:
        return "unset" if value is None else "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


def field_default(model: type[BaseModel], name: str) -> Any:
    """The default of field ``name`` of ``model``: for code that shares a spec's default."""
    return model.model_fields[name].get_default(call_default_factory=True)


class _Strict(BaseModel):
    # strict: `workers: true` is not 1 and `workers: 2.5` is not 2; no NaN or infinity in any field.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


_OTHER_LR = "; ".join(f"{m} with {o} {lr:g}" for m, row in CATALOGUE.items() for o, lr in row.other_lr.items())


class HyperParams(_Strict):
    """Model and optimiser settings; unset ones take the model's default (the model catalogue)."""

    rank: int | None = Field(
        None, ge=1, le=1024, description="PMF latent dimension", json_schema_extra=shown(per_model_hyper("rank"))
    )
    lr: float | None = Field(
        None,
        gt=0,
        le=100,
        description="learning rate",
        json_schema_extra=shown(f"{per_model_hyper('lr')}; {_OTHER_LR}"),
    )
    optimizer: Literal["sgd_momentum", "adam"] | None = Field(
        None,
        description="sgd_momentum (Nesterov) | adam (lazy: only the rows a step touches); PMF offers both",
        json_schema_extra=shown(per_model("optimizer")),
    )
    momentum: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="Nesterov momentum (PMF, sgd_momentum)",
        json_schema_extra=shown(per_model_hyper("momentum")),
    )
    l2: float | None = Field(
        None, ge=0, description="L2 regularisation", json_schema_extra=shown(per_model_hyper("l2"))
    )
    init_std: float | None = Field(
        None,
        gt=0,
        le=10,
        description="std of the initial factors (PMF)",
        json_schema_extra=shown(per_model_hyper("init_std")),
    )
    lr_decay: float | None = Field(
        None,
        gt=0,
        le=1,
        description="learning rate × this every epoch at one worker's "
        "pace (steps: minibatches, / workers under sync.combine sum)",
        json_schema_extra=shown(per_model_hyper("lr_decay")),
    )
    row_grad: Literal["mean", "sum"] | None = Field(
        None,
        description="PMF: a row that recurs in a minibatch gets the mean of its ratings' gradients, or their sum "
        "(the minibatch loss's gradient: under Adam a step weighs as many ratings as it carries)",
        json_schema_extra=shown(per_model_hyper("row_grad")),
    )
    l2_every_step: bool | None = Field(
        None,
        description="sparse LR: the l2 penalty of every step on every feature, paid lazily (a feature "
        "untouched for k - 1 steps gets k × l2 × w when next touched); else only touched features pay it",
        json_schema_extra=shown(per_model_hyper("l2_every_step")),
    )
    cold_k: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="PMF: a held-out rating whose user or item has at most this many training ratings "
        "is predicted from the biases alone (0: off; scoring then reads the training split once)",
        json_schema_extra=shown(per_model_hyper("cold_k")),
    )


class SyncSpec(_Strict):
    """How the workers' updates meet (docs/ARCHITECTURE.md, "Synchronisation")."""

    mode: Literal["bsp", "ssp", "isp"] = Field("isp", description="bsp | ssp | isp")
    significance: float | None = Field(
        None,
        ge=0,
        description="ISP v: an entry is sent when |δ_i|/|x_i| > v/sqrt(t); 0 = BSP exactly",
        json_schema_extra=shown(per_model("significance")),
    )
    slack: int = Field(3, ge=0, le=1000, description="SSP: how many steps ahead of the slowest worker a worker may run")
    quantize: bool = Field(
        True, description="ISP (v > 0): int8 values with a per-row scale; the rounding stays pending"
    )
    combine: Literal["mean", "sum"] | None = Field(
        None,
        description="a step moves a row by the mean of its touchers' proposals or by their sum (as if taken in turn)",
        json_schema_extra=shown(per_model("combine")),
    )
    sum_cap: int = Field(
        8,
        ge=1,
        le=10_000,
        description="combine sum: a row more than this many "
        "workers touched in a step moves by this many times their mean (lower it to 4 for ISP with "
        "a high v at 16+ workers)",
    )


class StopSpec(_Strict):
    """When a job ends (the first rule that holds)."""

    target_loss: float | None = Field(
        None, gt=0, description="training loss (RMSE for pmf, log-loss for LR) at or below this ..."
    )
    patience: int = Field(10, ge=1, description='... for this many consecutive steps: "converged"')
    target_val: float | None = Field(
        None,
        gt=0,
        description="or: the validation metric (the test split stands in "
        'when the data has no validation split) at or below this: "converged"',
    )
    eval_every: int | None = Field(
        None,
        ge=0,
        description="score the validation split every N steps (0: never)",
        json_schema_extra=shown(
            "an epoch at one worker's pace, as lr_decay, with a "
            f"validation split; else {EVAL_EVERY_WITH_TARGET} with "
            "target_val; else never"
        ),
    )
    patience_evals: int = Field(5, ge=1, description='validation: no better for this many scorings: "early_stopped"')
    min_delta: float = Field(1e-4, ge=0, description="... where better means lower by this share at least")
    max_epochs: float | None = Field(
        None,
        gt=0,
        description="passes over the training data",
        json_schema_extra=shown(
            f"{MAX_EPOCHS_WITH_VAL} × workers with a validation "
            "split, where early stopping ends a job first; without "
            "one " + per_model("max_epochs_without_val")
        ),
    )
    max_seconds: float = Field(3600, gt=0, description="job time, across rounds")
    budget_usd: float | None = Field(None, gt=0, description="stop before the estimated AWS cost would pass this")


class ScheduleEntry(_Strict):
    epoch: float = Field(ge=0)
    workers: int = Field(ge=1)


class ScalingSpec(_Strict):
    """How the fleet changes as the model converges (docs/ARCHITECTURE.md, "auto-tuner")."""

    policy: Literal["autotune", "none", "schedule"] = Field(
        "autotune", description="autotune (MLLess scale-in) | none | schedule"
    )
    min_workers: int = Field(1, ge=1, description="never fewer workers than this")
    interval_s: float = Field(20, gt=0, description="T: how often the auto-tuner decides")
    horizon_s: float = Field(10, gt=0, description="Δ ≤ T: how far ahead it projects")
    tolerance: float = Field(0.02, ge=0, le=1, description="S: evict while the projected degradation s_Δ < S")
    knee_tolerance: float = Field(
        0.1, gt=0, description="knee: the smoothed slope is flatter than this share of the steepest ..."
    )
    knee_patience: int = Field(5, ge=1, description="... for this many checks")
    knee_min_drop: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="knee: not before the smoothed loss has fallen this "
        "share below its level after the warm-up (an early plateau is not the knee)",
    )
    throughput_tolerance: float = Field(
        0.1,
        ge=0,
        le=1,
        description="evict only while the projected minibatches "
        "per second with one worker fewer stay within this share of the initial "
        "fleet's (1: off)",
    )
    schedule: list[ScheduleEntry] = Field(
        default_factory=list, description="policy schedule: [{epoch: 2, workers: 4}, ...] (locally also scale-out)"
    )
    scale_lr: bool = Field(
        False,
        description="below the initial fleet P, learning rate × p/P (linear scaling rule; sync.combine mean only)",
    )
    noise_ratio: float | None = Field(
        None,
        ge=0,
        description="the auto-tuner's cost guard under sync.combine mean: B_noise/B at the initial fleet "
        "if known (0: a step's progress does not depend on the fleet); none: measured, from noise-dominated",
    )

    @model_validator(mode="after")
    def _check(self) -> ScalingSpec:
        if self.horizon_s > self.interval_s:
            raise ValueError(f"horizon_s ({self.horizon_s}) must be ≤ interval_s ({self.interval_s})")
        if self.policy == "schedule" and not self.schedule:
            raise ValueError("policy 'schedule' needs a non-empty 'schedule' list")
        return self


class FaultSpec(_Strict):
    """What the job does when a worker dies or stalls, or the update store goes away."""

    worker_timeout_s: float = Field(10, gt=0, description="a worker with no heartbeat for this long is lost")
    startup_timeout_s: float = Field(
        120, gt=0, description="... before its first heartbeat of a round (process start, Lambda cold start)"
    )
    supervisor_timeout_s: float = Field(
        120, gt=0, description="a stalled supervisor (no heartbeat) is waited for this long, then its workers fail"
    )
    on_worker_loss: Literal["evict", "restart_round", "fail"] = Field(
        "evict", description="evict (go on without it) | restart_round (from its checkpoints) | fail; SSP restarts"
    )
    max_restarts: int = Field(3, ge=0, description="run rounds again at most this many times in a job")


class PrepareSpec(_Strict):
    """How to prepare ``data`` from a raw file when it holds no prepared dataset yet
    (the flags of ``ebb prepare``; on AWS the Prepare state runs it)."""

    format: Literal["movielens", "criteo", "libsvm", "csv"] = Field(
        description="the input's format: MovieLens ratings, Criteo TSV, LibSVM, or CSV with a label column"
    )
    input: str = Field(description="raw input: a local file, s3://bucket/key, or (on AWS) a key in the data bucket")
    test_input: str | None = Field(None, description="a separate test file (else test_fraction of the input)")
    batch_size: int = Field(6250, ge=1, description="rows per minibatch (MLLess: 6,250)")
    test_fraction: float = Field(0.1, ge=0, lt=1, description="share of the rows held out for test")
    val_fraction: float = Field(
        0.1, ge=0, lt=1, description="share held out as a validation split (early stopping; 0: none)"
    )
    seed: int = Field(0, description="the shuffle's seed")
    skip_bad_rows: bool = Field(False, description="count and skip malformed rows instead of stopping")
    num_features: int = Field(100_000, ge=1, description="hashing-trick dimension (criteo)")
    numeric_scaling: Literal["log", "minmax"] = Field("log", description="criteo integer columns: log | minmax")
    max_dimension: int = Field(
        1 << 24, ge=1, description="at most this many features, users or items (a larger dataset is refused)"
    )

    @model_validator(mode="after")
    def _check(self) -> PrepareSpec:
        if self.format == "criteo" and self.num_features > self.max_dimension:
            raise ValueError(f"num_features {self.num_features} is more than max_dimension {self.max_dimension}")
        if self.test_input is None and self.test_fraction + self.val_fraction >= 1:
            raise ValueError(
                f"test_fraction + val_fraction must be below 1, got {self.test_fraction} + {self.val_fraction}"
            )
        return self


class AwsSpec(_Strict):
    """What a local run is priced at (cost model); on a stack, Validate sets these from the deployment.

    A deployed job runs on the functions and cache the stack was deployed with (cdk.json's
    ebb: keys): their memory, architecture and cache replace these fields in its spec, so
    its cost is always priced from what runs. The defaults are cdk.json's."""

    memory_mb: int = Field(1769, ge=128, le=10240, description="Lambda memory per worker (1769 MB = one vCPU)")
    supervisor_memory_mb: int = Field(
        1024,
        ge=128,
        le=10240,
        description="the supervisor's (the deployment's default, cdk.json ebb:supervisorMemoryMb)",
    )
    part_cache_mb: int | None = Field(
        None,
        ge=0,
        description="minibatches a worker keeps decoded in memory, MB (0: none)",
        json_schema_extra=shown("a quarter of memory_mb"),
    )
    arch: Literal["x86_64", "arm64"] = Field("x86_64", description="x86_64 | arm64")
    cache_node_type: str = Field("cache.t4g.medium", description="the cache's node type")
    cache_nodes: int = Field(1, ge=1, description="and its nodes")
    signal_channel: Literal["redis", "sns_sqs"] = Field(
        "redis", description="redis | sns_sqs (one job at a time per deployment)"
    )

    def part_cache_bytes(self) -> int:
        """A worker's budget for decoded minibatches, in bytes."""
        mb = self.memory_mb // 4 if self.part_cache_mb is None else self.part_cache_mb
        return mb << 20


class ClockSpec(_Strict):
    """Which clock the job runs on: host time, or the modelled time of a fleet (docs/ARCHITECTURE.md, "Fleet clock")."""

    kind: Literal["host", "fleet"] = Field(
        "host",
        description="host (this machine's time) | fleet (a step = the "
        "barrier's release + the slowest worker's CPU, its I/O overlapping its "
        "bytes / link, + requests × rtt)",
    )
    link_mb_s: float = Field(75.0, gt=0, description="fleet: one worker's link to the cache, MB/s (Lambda, measured)")
    rtt_ms: float = Field(
        0.4, ge=0, description="fleet: one update-store request's round trip, ms (ElastiCache in the VPC)"
    )
    node_mb_s: float = Field(
        625.0,
        gt=0,
        description="fleet: the cache node's link, MB/s per direction, shared by "
        "all workers (cache.t4g.medium: up to 5 Gbit/s)",
    )
    cold_start_s: float = Field(
        3.0,
        ge=0,
        description="fleet: one cold start of a wave of workers (round start, joiners): container image + imports",
    )
    barrier_ms: float = Field(
        0.5,
        ge=0,
        description="fleet: the barrier's release beyond the round trips, ms: from "
        "the last announcement to a waiting worker's go (the cache's script, its push, the "
        "worker waking)",
    )


class JobSpec(_Strict):
    """A training job: every field, with its default (``ebb spec`` prints them all)."""

    name: str = Field(
        default_factory=lambda: f"job-{uuid.uuid4().hex[:8]}",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="the job's name; outputs go to runs/<name> unless `out` is set",
        json_schema_extra=shown("job-<random>"),
    )
    model: ModelName = Field("pmf", description=" | ".join(f"{m} ({row.reads})" for m, row in CATALOGUE.items()))
    data: str = Field(
        description="prepared dataset: a folder or s3://bucket/prefix (from `ebb prepare`)",
        json_schema_extra={"example": "data/ratings"},
    )
    prepare: PrepareSpec | None = Field(
        None,
        description="prepare `data` from a raw file first if it is not "
        "prepared: {format, input, batch_size, test_fraction, ...} as ebb prepare",
    )
    out: str | None = Field(
        None, description="output folder or s3://bucket/prefix", json_schema_extra=shown("runs/<name>")
    )
    seed: int = Field(0, description="initial model and minibatch order")
    workers: int = Field(1, ge=1, le=256, description="workers at the start")
    hyper: HyperParams = Field(default_factory=HyperParams)
    sync: SyncSpec = Field(default_factory=SyncSpec)
    stop: StopSpec = Field(default_factory=StopSpec)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    aws: AwsSpec = Field(default_factory=AwsSpec)
    faults: FaultSpec = Field(default_factory=FaultSpec)
    clock: ClockSpec = Field(default_factory=ClockSpec)
    redis_urls: list[str] = Field(
        default_factory=list, description="locally: use these Redis servers (sharded) instead of starting one"
    )
    round_seconds: float = Field(
        840,
        gt=0,
        description="training time per round, then checkpoint and resume in "
        "fresh processes (Lambda: also the function's timeout less a margin)",
    )
    round_steps: int | None = Field(
        None,
        ge=2,
        description="at most this many steps per round (reproducible cuts; under SSP a round runs at least slack + 2)",
        json_schema_extra=shown("no limit"),
    )

    @model_validator(mode="after")
    def _fill_defaults(self) -> JobSpec:
        row = entry(self.model)
        if self.hyper.optimizer is None:
            self.hyper.optimizer = row.optimizer
        elif self.hyper.optimizer not in row.optimizers:
            raise ValueError(f"hyper.optimizer: model {self.model} trains with {' or '.join(row.optimizers)} only")
        if self.hyper.lr is None and self.hyper.optimizer in row.other_lr:
            self.hyper.lr = row.other_lr[self.hyper.optimizer]
        if self.sync.combine is None:
            self.sync.combine = row.combine
        if self.sync.significance is None:
            self.sync.significance = row.significance
        for key, value in row.hyper.items():
            if getattr(self.hyper, key) is None:
                setattr(self.hyper, key, value)
        for key in ("row_grad", "l2_every_step"):  # one model's own settings
            if getattr(self.hyper, key) is not None and key not in row.hyper:
                owner = next(name for name, r in CATALOGUE.items() if key in r.hyper)
                raise ValueError(f"hyper.{key}: a setting of model {owner} only, not {self.model}")
        if self.scaling.min_workers > self.workers:
            self.scaling.min_workers = self.workers
        if self.stop.target_val is not None and self.stop.eval_every is None:
            self.stop.eval_every = EVAL_EVERY_WITH_TARGET
        if self.sync.mode == "ssp" and self.scaling.policy != "none" and self.workers > 1:
            raise ValueError("scaling.policy must be 'none' with sync.mode 'ssp' (workers change only at a barrier)")
        return self

    def epoch_limit(self, has_val: bool) -> float:
        """``stop.max_epochs``, or its default for data with (or without) a validation split."""
        if self.stop.max_epochs is not None:
            return self.stop.max_epochs
        return MAX_EPOCHS_WITH_VAL * self.workers if has_val else entry(self.model).max_epochs_without_val

    @property
    def effective_sync_mode(self) -> str:
        """The sync model the workers run: a job that starts alone (and never grows) is BSP."""
        return self.sync.mode if self.workers > 1 or self.scaling.policy == "schedule" else "bsp"

    @property
    def out_location(self) -> str:
        """Where the outputs go: a folder or ``s3://bucket/prefix`` (default runs/<name>)."""
        return self.out or str(Path("runs") / self.name)


def example_yaml() -> str:
    """Every field of a job file with its default and what it means, as YAML (``ebb spec``,
    the README): generated from the spec itself, so the two never disagree."""
    lines: list[str] = []

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
            if isinstance(value, BaseModel):
                add(f"{indent}{name}:", (type(value).__doc__ or "").strip().splitlines()[0])
                emit(type(value), indent + "  ")
                continue
            note = info.description or ""
            if "shown_default" in extra and name != "name":
                note += f" (default: {extra['shown_default']})"
            value = "my-job" if name == "name" else extra.get("example", value)
            text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
            add(f"{indent}{name}: {text.removesuffix('...').strip()}", note)

    emit(JobSpec, "")
    return "\n".join(line.rstrip() for line in lines) + "\n"


class SpecError(ValueError):
    """A job spec problem, already phrased as ``file:line: field: what is wrong``."""


class _JobLoader(yaml.SafeLoader):  # type: ignore[misc]  # (yaml has no type stubs here)
    """YAML as people write numbers and mappings: ``1e9`` and ``3e-5`` are floats (YAML 1.2's
    rule; PyYAML's 1.1 rule wants a dot and reads them as strings), and a mapping that gives
    a key twice is an error at the second one (PyYAML keeps the last, silently)."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = first.get(key)
                except TypeError:  # an unhashable key: the base class says so
                    break
                if seen is not None:
                    raise yaml.constructor.ConstructorError(
                        problem=f"duplicate key {key!r} (first on line {seen})", problem_mark=key_node.start_mark
                    )
                first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_JobLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def load_yaml(text: str) -> Any:
    """Parse job YAML (a file, or a ``--set`` value) with :class:`_JobLoader`'s rules."""
    return yaml.load(text, Loader=_JobLoader)  # noqa: S506 (a SafeLoader)


Path_ = tuple[str | int, ...]


def _key_lines(text: str) -> dict[Path_, int]:
    """Map each mapping key path in a YAML document to its 1-based line."""
    lines: dict[Path_, int] = {}

    def walk(node: yaml.Node, path: Path_) -> None:
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


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"stop.patience_evals=8"`` -> ``("stop.patience_evals", 8)``: a dotted field and a
    value read as YAML (``8`` an int, ``0.5`` a float, ``true``, ``null``, ``[1, 2]``)."""
    field, sep, raw = text.partition("=")
    field = field.strip()
    if not sep or not field or any(not part for part in field.split(".")):
        raise SpecError(f"command line: --set {text}: expected FIELD=VALUE, e.g. stop.patience_evals=8")
    try:
        value = load_yaml(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        why = getattr(exc, "problem", exc)
        raise SpecError(f"command line: {field}: {raw!r} is not a YAML value ({why})") from None
    return field, value


def _set_path(doc: dict[str, Any], dotted: str) -> tuple[dict[str, Any], str]:
    """The mapping that holds ``dotted``'s last part (made on the way), and that part."""
    node = doc
    *parents, leaf = dotted.split(".")
    for depth, part in enumerate(parents):
        child = node.setdefault(part, {})
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parents[: depth + 1])
            raise SpecError(f"command line: {dotted}: {where} is a value, not a section of fields")
        node = child
    return node, leaf


def load_spec(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    assignments: list[str] | tuple[str, ...] = (),
) -> JobSpec:
    """Read a YAML job file (optional), apply ``{"dotted.field": value}`` overrides (flags;
    None: not given) and then ``FIELD=VALUE`` assignments (``--set``; ``null`` unsets), validate."""
    text, source = "", "<flags>"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise SpecError(f"{path}: cannot read job file: {exc.strerror}") from None
        except UnicodeDecodeError as exc:  # a binary file named as the job file
            raise SpecError(
                f"{path}: not a text file (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
            ) from None
    try:
        doc = load_yaml(text) if text else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise SpecError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if doc is None:
        doc = {}
    lines = _key_lines(text) if text else {}
    overridden: set[Path_] = set()
    if isinstance(doc, dict):
        given = [(dotted, value) for dotted, value in (overrides or {}).items() if value is not None]
        for dotted, value in given + [parse_assignment(a) for a in assignments]:
            node, leaf = _set_path(doc, dotted)
            node[leaf] = value
            overridden.add(tuple(dotted.split(".")))
    return parse_spec(doc, source, lines=lines, overridden=overridden)


def parse_spec(
    doc: Any,
    source: str,
    *,
    lines: dict[Path_, int] | None = None,
    overridden: set[Path_] | frozenset[Path_] = frozenset(),
) -> JobSpec:
    """Validate a job document (a parsed YAML file, or a state machine's JSON input);
    a problem is a SpecError naming ``source`` (and the line, when known) and the field."""
    if not isinstance(doc, dict):
        raise SpecError(f"{source}:1: a job file is a mapping of fields, got {type(doc).__name__}")
    lines = lines or {}

    def where(loc: Path_) -> str:
        if loc and any(loc[: len(o)] == o or o[: len(loc)] == loc for o in overridden):
            return "command line"
        line = next((lines[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in lines), None)
        return f"{source}:{line}" if line else source

    for (section, old), new in RENAMED.items():
        if isinstance(doc.get(section), dict) and old in doc[section]:
            raise SpecError(f"{where((section, old))}: {section}.{old}: renamed to {new}")
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(job)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        raise SpecError(f"{where(loc)}: {field}: {msg}") from None
