"""Command-line flags generated from the spec's fields: name, type, choices, help text and
the default shown all come from the field (``ebb.spec``) and the model catalogue, so
``--help`` cannot drift from what a job does. ``--set FIELD=VALUE`` reaches every field.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ebb.spec import JobSpec, default_text


@dataclass(frozen=True)
class Flag:
    """A flag for the spec field ``field`` (a dotted path: ``stop.patience_evals``)."""

    field: str
    flag: str | None = None  # default: the field's last part, ``--patience-evals``
    metavar: str | None = None

    @property
    def option(self) -> str:
        return self.flag or "--" + self.field.rsplit(".", 1)[-1].replace("_", "-")

    @property
    def dest(self) -> str:
        return "spec__" + self.field.replace(".", "__")


# The common fields of a job, as flags of `ebb train` and `ebb submit`; every other field
# is reachable with --set.
JOB_FLAGS = (
    Flag("name"),
    Flag("model"),
    Flag("data", metavar="DIR"),
    Flag("out", metavar="DIR"),
    Flag("seed"),
    Flag("workers"),
    Flag("hyper.rank"),
    Flag("hyper.lr"),
    Flag("hyper.optimizer"),
    Flag("hyper.momentum"),
    Flag("hyper.l2"),
    Flag("hyper.lr_decay"),
    Flag("sync.mode", "--sync"),
    Flag("sync.significance", metavar="V"),
    Flag("sync.slack", metavar="S"),
    Flag("sync.quantize"),
    Flag("sync.combine"),
    Flag("stop.target_val"),
    Flag("stop.patience_evals", metavar="N"),
    Flag("stop.min_delta"),
    Flag("stop.eval_every", metavar="N"),
    Flag("stop.target_loss"),
    Flag("stop.patience", metavar="N"),
    Flag("stop.max_epochs"),
    Flag("stop.max_seconds"),
    Flag("stop.budget_usd"),
    Flag("scaling.policy"),
    Flag("scaling.min_workers"),
    Flag("aws.memory_mb"),
    Flag("round_seconds", metavar="S"),
    Flag("round_steps", metavar="N"),
)
# Only where the job runs here (`ebb train`).
LOCAL_FLAGS = (
    Flag("redis_urls", "--redis", metavar="URL"),
    Flag("clock.kind", "--clock"),
    Flag("clock.link_mb_s", metavar="MB_S"),
)


_METAVARS: dict[Any, str] = {int: "N", float: "X", str: "TEXT"}


def field_info(model: type[BaseModel], dotted: str) -> FieldInfo:
    """The pydantic field at ``dotted`` (``stop.patience_evals``) of ``model``."""
    *parents, leaf = dotted.split(".")
    for part in parents:
        model = _submodel(model.model_fields[part].annotation)
    return model.model_fields[leaf]


def _submodel(annotation: Any) -> type[BaseModel]:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    raise TypeError(f"{annotation!r} is not a section of fields")


def _scalar(annotation: Any) -> Any:
    """``T`` of ``T | None``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def help_text(info: FieldInfo) -> str:
    """A field's description and the default it takes, as ``--help`` shows them."""
    text = f"{info.description or ''} (default: {default_text(info)})".strip()
    return text.replace("%", "%%")  # argparse formats help with %


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    model: type[BaseModel],
    flags: Iterable[Flag],
    *,
    required: bool = True,
) -> None:
    """Add a flag for each field: its type or choices from the annotation, its help from
    the description and its default. Given flags hold a value; absent ones hold None (the
    spec's default applies). A field without a default is required when ``required``."""
    for flag in flags:
        info = field_info(model, flag.field)
        kind = _scalar(info.annotation)
        # A field without a default has nothing to show but its description.
        shown = (info.description or "").replace("%", "%%") if info.is_required() else help_text(info)
        kwargs: dict[str, Any] = {"dest": flag.dest, "default": None, "help": shown}
        if flag.metavar or kind in _METAVARS:
            kwargs["metavar"] = flag.metavar or _METAVARS[kind]
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is typing.Literal:
            kwargs["choices"] = list(typing.get_args(kind))
        elif typing.get_origin(kind) is list:
            kwargs.update(action="append", type=typing.get_args(kind)[0])
        else:
            kwargs["type"] = kind
        if required and info.is_required():
            kwargs["required"] = True
        parser.add_argument(flag.option, **kwargs)


def given(args: argparse.Namespace, flags: Iterable[Flag]) -> dict[str, Any]:
    """``{"dotted.field": value}`` of the flags in ``args`` (None where a flag was not given)."""
    return {flag.field: getattr(args, flag.dest, None) for flag in flags}


def option_of(field: str, flags: Iterable[Flag]) -> str:
    """The flag that sets ``field``, for an error message (the field itself when none does)."""
    return next((flag.option for flag in flags if flag.field == field), field)


def add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="set any field of the job (a dotted path, as `ebb spec` prints them) to a YAML value, "
        "e.g. --set stop.patience_evals=8 --set scaling.knee_min_drop=0.1; repeatable",
    )


def defaults_shown(parser: argparse.ArgumentParser) -> Mapping[str, str]:
    """Each generated flag's help text, by field (for a test that holds it to the spec)."""
    return {
        a.dest.removeprefix("spec__").replace("__", "."): a.help or ""
        for a in parser._actions
        if a.dest.startswith("spec__")
    }


def job_field(dotted: str) -> FieldInfo:
    return field_info(JobSpec, dotted)


def add_job_arguments(
    parser: argparse.ArgumentParser,
    flags: Iterable[Flag],
    job_help: str = "job file (YAML); `ebb spec` prints every field",
) -> None:
    """What every command that runs a job takes: the job file, the flags that override its
    fields (none required: the file or the spec's defaults may give them) and ``--set``."""
    from ebb.spec import JobSpec

    parser.add_argument("job", nargs="?", help=job_help)
    add_flags(parser, JobSpec, flags, required=False)
    add_set(parser)
