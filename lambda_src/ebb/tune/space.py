"""What ``ebb tune`` searches: the ``tune:`` section of a job file (and its flags), the
space over ``hyper.*`` / ``sync.*`` fields, and the built-in ``--quick`` spaces.

A space maps a dotted field to one distribution, in YAML::

    tune:
      trials: 9
      budget_usd: 0.05
      space:
        hyper.lr: {log_uniform: [0.003, 0.1]}
        hyper.l2: {uniform: [0.0, 0.2]}
        hyper.rank: {choice: [10, 20, 40]}

or on the command line ``--param hyper.lr=log_uniform:0.003,0.1`` (repeatable). Bounds
that are both integers sample integers. Bounds may be multiples of the base job's own
value instead (``{log_uniform: [0.5, 2], relative: true}``, ``log_uniform:0.5x,2x``): the
value it would train with, PMF's data-shaped l2 included, so one space fits data of any
shape. The distributions are Optuna's, so its samplers (QMC, TPE, random) draw from them.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ebb.spec import HyperParams, JobSpec, SpecError, SyncSpec

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

    from ebb.ports.manifest import Manifest

KINDS = ("log_uniform", "uniform", "choice")
TUNABLE = {"hyper": HyperParams, "sync": SyncSpec}  # the sections a space may reach


class Param(BaseModel):
    """One searched field: exactly one of log_uniform, uniform (bounds) or choice (values)."""

    model_config = ConfigDict(extra="forbid")

    # int | float: bounds given as integers sample integers (hyper.rank).
    log_uniform: tuple[int | float, int | float] | None = None
    uniform: tuple[int | float, int | float] | None = None
    choice: list[Any] | None = None
    # The bounds are multiples of the base job's value of the field (start_point resolves it).
    relative: bool = False

    @model_validator(mode="after")
    def _one(self) -> Param:
        given = [k for k in KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(KINDS)}")
        if self.relative and self.choice is not None:
            raise ValueError("relative: bounds only (log_uniform or uniform), not choice")
        bounds = self.log_uniform or self.uniform
        if bounds is not None:
            lo, hi = bounds
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"bounds [{lo}, {hi}]: need finite low < high")
            if self.log_uniform is not None and lo <= 0:
                raise ValueError("log_uniform needs a low bound above 0")
        if self.choice is not None and not self.choice:
            raise ValueError("choice needs at least one value")
        return self

    def distribution(self, base: Any = None) -> BaseDistribution:
        """Optuna's distribution; ``base`` is the base job's value, which relative bounds multiply."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.choice is not None:
            return CategoricalDistribution(self.choice)
        bounds = self.log_uniform or self.uniform
        assert bounds is not None
        lo, hi = bounds
        log = self.log_uniform is not None
        if self.relative:
            if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 0:
                raise SpecError(f"relative bounds need the base job's value above 0, not {base!r}")
            lo, hi = lo * base, hi * base
            if isinstance(base, int):  # an integer field (hyper.rank) samples integers
                lo, hi = max(1, math.ceil(lo)), max(1, math.floor(hi))
                if lo >= hi:
                    raise SpecError(f"relative bounds [{lo}, {hi}] around {base}: no integers to choose from")
        if isinstance(lo, int) and isinstance(hi, int):
            return IntDistribution(lo, hi, log=log)
        return FloatDistribution(float(lo), float(hi), log=log)


def parse_param(text: str) -> tuple[str, Param]:
    """``hyper.lr=log_uniform:0.003,0.1`` (the ``--param`` flag) -> (field, Param)."""
    field, sep, rest = text.partition("=")
    kind, sep2, values = rest.partition(":")
    if not sep or not sep2 or kind not in KINDS:
        raise SpecError(f"--param {text}: write FIELD=KIND:A,B with KIND one of {', '.join(KINDS)}")
    raw = [v.strip() for v in values.split(",")]
    relative = kind != "choice" and all(v.endswith("x") for v in raw)  # 0.5x,2x: times the base job's value
    items = [yaml.safe_load(v.removesuffix("x") if relative else v) for v in raw]
    return field.strip(), _param(field.strip(), {kind: items, **({"relative": True} if relative else {})})


def _param(field: str, raw: Any) -> Param:
    if not isinstance(raw, dict):
        raise SpecError(
            f"tune.space.{field}: write {{log_uniform: [lo, hi]}}, {{uniform: [lo, hi]}} or {{choice: [...]}}"
        )
    try:
        param = Param.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(f"tune.space.{field}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    _check_field(field, param)
    return param


def _check_field(field: str, param: Param) -> None:
    section, _, leaf = field.partition(".")
    model = TUNABLE.get(section)
    if model is None or leaf not in model.model_fields:
        known = ", ".join(f"{s}.{f}" for s, m in TUNABLE.items() for f in m.model_fields)
        raise SpecError(f"tune.space: {field} is not a hyper.* or sync.* field ({known})")
    if param.relative:  # the values are known once the base job is (start_point checks them then)
        return
    values = param.choice if param.choice is not None else list(param.log_uniform or param.uniform or ())
    for value in values:
        try:
            model.model_validate({leaf: value})
        except ValidationError as exc:
            raise SpecError(f"tune.space.{field}: {value!r}: {exc.errors()[0]['msg']}") from None


class TuneSpec(BaseModel):
    """How ``ebb tune`` searches (the job file's ``tune:`` section; flags override it)."""

    model_config = ConfigDict(extra="forbid")

    trials: int = Field(9, ge=1, le=10_000, description="configurations sampled (the trial budget)")
    budget_usd: float | None = Field(
        None, gt=0, description="total estimated AWS cost of all trials: no trial starts or goes on past it"
    )
    eta: int = Field(3, ge=2, le=10, description="successive halving: keep the best 1/eta of a rung, promote it")
    min_epochs: int = Field(
        1, ge=1, description="the first rung, in epochs at one worker's pace (as lr_decay and the scorings)"
    )
    max_epochs: int = Field(9, ge=1, description="the last rung: a promoted trial trains this many epochs in all")
    sampler: Literal["tpe", "qmc", "random"] = Field(
        "tpe", description="tpe: QMC for the first eta trials, then TPE | qmc | random (Optuna's samplers)"
    )
    ladder: Literal["fixed", "base"] = Field(
        "fixed",
        description="fixed: rungs at min_epochs x eta^k | base: the base trial (from_base) trains first, "
        "alone, to its own end; the last rung below the top is base_share of its epochs, with more rungs "
        "below it (each 1/eta of the next) when the trials are many (TuneSpec.base_rungs)",
    )
    base_share: float = Field(
        0.3, gt=0, lt=1, description='ladder "base": the last rung below the top as a share of the base trial\'s epochs'
    )
    compare_within: list[str] = Field(
        default_factory=list,
        description="choice fields whose trials a rung ranks among themselves (each trial by its place "
        "in its own group): an optimizer that converges more slowly per epoch is not judged against a "
        "faster one at the same early epoch",
    )
    scheduler: Literal["asha", "none"] = Field(
        "asha", description="asha (successive halving, asynchronous) | none: every trial trains max_epochs"
    )
    parallel: int | None = Field(
        None, ge=1, description="CPU budget: running trials' workers together (default: this machine's cores)"
    )
    seed: int = Field(0, description="the sampler's seed")
    from_base: bool = Field(
        True,
        description="the first trial trains the base job's own settings (its values, else the model's "
        "defaults) and is always promoted: the search weighs every other trial against where it started",
    )
    space: dict[str, Param] = Field(default_factory=dict, description="field: distribution")

    @field_validator("space", mode="before")
    @classmethod
    def _space(cls, raw: Any) -> Any:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise ValueError("write field: {log_uniform|uniform|choice: ...}")
        return {str(k): v if isinstance(v, Param) else _param(str(k), v) for k, v in raw.items()}

    @model_validator(mode="after")
    def _ladder(self) -> TuneSpec:
        if self.max_epochs < self.min_epochs:
            raise ValueError(f"max_epochs ({self.max_epochs}) < min_epochs ({self.min_epochs})")
        choices = [f for f, p in self.space.items() if p.choice is not None]
        for field in self.compare_within:
            if field not in choices:
                listed = ", ".join(choices) or "none"
                raise ValueError(f"compare_within: {field} is not a choice field of tune.space ({listed})")
        return self

    def cpu_budget(self) -> int:
        return self.parallel or os.cpu_count() or 1

    def rungs(self) -> list[int]:
        """The epochs (one worker's pace) at which trials are compared: min_epochs × eta^k up
        to max_epochs, which is always the last."""
        if self.scheduler == "none":
            return [self.max_epochs]
        out, r = [], self.min_epochs
        while r < self.max_epochs:
            out.append(r)
            r *= self.eta
        return out + [self.max_epochs]

    def rungs_text(self) -> str:
        """The ladder in a few words (``ebb tune``'s first line)."""
        if self.ladder == "base" and self.scheduler == "asha" and self.from_base:
            n = self.base_rung_count()
            below = f"{n} rungs up to" if n > 1 else "a rung at"
            return (
                f"rungs from the base trial's run (it trains first, to its end; {below} "
                f"{self.base_share:g} of its epochs, then early stopping, at most {self.max_epochs})"
            )
        return f"rungs at {self.rungs()} epochs"

    def base_rungs(self, base_epochs: float) -> list[int]:
        """ladder "base": the rungs once the base trial has trained ``base_epochs`` epochs, to its
        own end (early stopping, as a default run ends). The last rung below the top is at
        ``base_share`` of them; with more trials, more rungs below it, each 1/eta of the next
        (``base_rung_count``: one up to eta^2 trials, two up to eta^3, ...), so that successive
        halving thins the many cheap first-rung trials as often as it can while the last
        decision before a full run stays at base_share; then max_epochs, the backstop: a
        promoted trial trains on until early stopping ends it, as the base trial did. The
        scale is the data's and the model's own (a sparse LR run that stops at 8 epochs is
        judged at 3, a PMF run that stops at 33 at 13), where a fixed ladder judged both at
        the same epochs."""
        last = base_epochs * self.base_share
        out: list[int] = []
        for k in range(self.base_rung_count() - 1, -1, -1):
            r = max(self.min_epochs, round(last / self.eta**k))
            if r < self.max_epochs and (not out or r > out[-1]):
                out.append(r)
        return out + [self.max_epochs]

    def base_rung_count(self) -> int:
        """ladder "base": how many rungs below the top. Each rung keeps 1/eta of the trials that
        reach it, so a search of ``trials`` can halve about log_eta(trials) times; the top (early
        stopping, the best of what reached it) is the last of those: one rung below it up to
        eta^2 trials (nine at eta 3: --quick), two up to eta^3 (27), three up to eta^4 (81)."""
        halvings, n = 0, self.trials
        while n >= self.eta:
            n //= self.eta
            halvings += 1
        return max(1, halvings - 1)

    def distributions(self, base: dict[str, Any] | None = None) -> dict[str, BaseDistribution]:
        """Each field's distribution; ``base`` (field -> the base job's value) resolves relative bounds."""
        out = {}
        for field, param in self.space.items():
            try:
                out[field] = param.distribution((base or {}).get(field))
            except SpecError as exc:
                raise SpecError(f"tune.space.{field}: {exc}") from None
        return out


# --quick: the built-in space per model (bench/tune.py measures it on every preset).
# Centred on the base job (relative bounds): PMF's l2 around the value the data's shape
# gives (the best l2 on the presets lay at 0.6-1.2x it), lr around the optimiser's
# default; sparse LR's lr_decay and l2 around its default (with l2 paid every step,
# hyper.l2_every_step, 1/3x and 3x the default were both worse on criteo-shaped). QMC for all
# nine trials: TPE, told the base trial first, drew most of the rest near its optimizer and
# rank; QMC spreads them, and its best validation was as good or better on 4 of 5 presets.
# The rungs are sized from the base trial's own run (ladder "base"): it trains first, to
# its early stopping (what `ebb train` would cost); the others are compared at 0.3 of its
# epochs, and the best 1/eta (the base trial holding one place) train on to their own early
# stopping (max_epochs 100 is the backstop, as `ebb train`'s). A fixed ladder (12, 36) cost
# 2.9-4.0x one run: on sparse LR (a run stops at 8 epochs) it pruned nothing, on PMF its
# 12-epoch rung was most of a run; replayed over every trial's full curve on the 5 presets,
# shares of 0.2-0.6 traded the ranking (validation at 1-4 epochs ranks poorly, at 12 well)
# against the cost, and 0.4 kept the pick on 4 of 5 within 3x; with the models' row_grad sum
# and l2_every_step, 0.3 and 0.4 picked the same trial on all 5, 0.3 for 2.3-3.1x one run and
# 0.4 for 2.5-3.2x (docs/RESULTS-TOOLS.md, 10). Sparse LR's validation ranks its trials
# earlier (the best of 27 first at 3 epochs of its 14, on QMC's and random draws alike), so
# 0.2 there. PMF's rungs rank each optimizer's trials among themselves (compare_within):
# SGD with momentum trails Adam for the first third of a run and then often passes it, so
# compared with Adam at one rung the best SGD trials were pruned (over 27 random draws per
# preset, random search's best was reached on 4 of 5 presets with it, on 1 without; on 5 of
# 5 once every trial starts before any is promoted: Search.next_job).
QUICK: dict[str, dict[str, Any]] = {
    "pmf": {
        "trials": 9,
        "eta": 3,
        "ladder": "base",
        "base_share": 0.3,
        "min_epochs": 1,
        "max_epochs": 100,
        "sampler": "qmc",
        "compare_within": ["hyper.optimizer"],
        "space": {
            "hyper.lr": {"log_uniform": [0.25, 1.5], "relative": True},
            "hyper.l2": {"log_uniform": [0.6, 1.25], "relative": True},
            "hyper.optimizer": {"choice": ["adam", "sgd_momentum"]},
            "hyper.rank": {"choice": [10, 20, 40]},
            "hyper.init_std": {"choice": [0.05, 0.1]},
        },
    },
    "sparse_lr": {
        "trials": 9,
        "eta": 3,
        "ladder": "base",
        "base_share": 0.2,
        "min_epochs": 1,
        "max_epochs": 100,
        "sampler": "qmc",
        "space": {
            "hyper.lr": {"log_uniform": [0.25, 1.5], "relative": True},
            "hyper.l2": {"log_uniform": [0.3, 2.0], "relative": True},
            "hyper.lr_decay": {"uniform": [0.75, 1.0]},
        },
    },
    "lr": {
        "trials": 9,
        "eta": 3,
        "min_epochs": 1,
        "max_epochs": 9,
        "space": {"hyper.lr": {"log_uniform": [0.005, 0.3]}, "hyper.l2": {"log_uniform": [1e-6, 1e-3]}},
    },
}


def tune_spec(
    section: dict[str, Any] | None, model: str, overrides: dict[str, Any], params: list[str], quick: bool
) -> TuneSpec:
    """The search: ``--quick``'s built-in one for ``model`` (if asked), under the job file's
    ``tune:`` section, under the flags (``overrides``: field -> value or None) and ``--param``s."""
    doc: dict[str, Any] = {}
    if quick:
        doc.update(QUICK[model])
    for key, value in (section or {}).items():
        doc[key] = {**doc.get("space", {}), **(value or {})} if key == "space" else value
    doc.update({k: v for k, v in overrides.items() if v is not None})
    if params:
        doc["space"] = dict(doc.get("space") or {})
        for text in params:
            field, param = parse_param(text)
            doc["space"][field] = param
    try:
        spec = TuneSpec.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where, message = ".".join(str(p) for p in err["loc"]), err["msg"].removeprefix("Value error, ")
        if not message.startswith("tune."):  # (a check of the whole section names its field itself)
            message = f"tune.{where}: {message}" if where else f"tune.{message}"
        raise SpecError(message) from None
    if not spec.space:
        raise SpecError("tune: nothing to search: give a space (tune.space in the job file, --param, or --quick)")
    return spec


def split_job_file(path: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """A job file's ``tune:`` section, and the rest of the file as YAML text for the job spec."""
    if path is None:
        return None, None
    try:
        doc = yaml.safe_load(open(path).read()) or {}
    except OSError as exc:
        raise SpecError(f"{path}: cannot read job file: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(doc, dict) or "tune" not in doc:
        return None, None
    section = doc.pop("tune")
    if section is not None and not isinstance(section, dict):
        raise SpecError(f"{path}: tune: write a section of fields (trials, budget_usd, space, ...)")
    return section, yaml.safe_dump(doc, sort_keys=False)


def start_point(spec: TuneSpec, base: JobSpec, manifest: Manifest) -> dict[str, Any]:
    """The base job's values of the searched fields, as it would train (hyper-parameters the
    data sets, such as PMF's l2, resolved from ``manifest``): what relative bounds multiply,
    and (``from_base``) the search's first trial, where they lie inside the distributions
    (``Search`` decides). Checks that every relative bound has a value to multiply."""
    from ebb.models import resolve_hyper

    sections = {"hyper": resolve_hyper(base.model, manifest, base.hyper), "sync": base.sync}
    point: dict[str, Any] = {}
    for field in spec.space:
        section, _, leaf = field.partition(".")
        value = getattr(sections[section], leaf)
        if value is not None:
            point[field] = value
    for field, dist in spec.distributions(point).items():
        if spec.space[field].relative:  # resolved bounds must be values the field takes
            _check_field(field, Param(choice=[dist.low, dist.high]))  # type: ignore[attr-defined]
    return point


def inside(dists: dict[str, BaseDistribution], point: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``point`` whose values lie inside their distributions."""
    out = {}
    for field, value in point.items():
        dist = dists.get(field)
        if dist is None:
            continue
        try:
            ok = dist._contains(dist.to_internal_repr(value))
        except (ValueError, TypeError):
            ok = False
        if ok:
            out[field] = value
    return out
