"""`--help` is generated from the spec: every default it shows is the one a job gets, and
every field can be set from the command line."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import yaml

from ebb.catalogue import CATALOGUE
from ebb.cli import build_parser, main
from ebb.flags import JOB_FLAGS, LOCAL_FLAGS, defaults_shown, field_info
from ebb.spec import AwsSpec, ClockSpec, JobSpec, PrepareSpec, ScalingSpec, SpecError, field_default, load_spec

ROOT = Path(__file__).resolve().parents[2]


def _subparser(name: str):
    parser = build_parser()
    return next(a for a in parser._actions if hasattr(a, "choices") and a.choices and name in a.choices).choices[name]


def _shown(help_text: str) -> str:
    match = re.search(r"\(default: (.*)\)$", " ".join(help_text.split()))
    assert match, help_text
    return match.group(1).replace("%%", "%")


def _value(spec: object, dotted: str) -> object:
    for part in dotted.split("."):
        spec = getattr(spec, part)
    return spec


def _plain(text: str):
    """A default as shown, read back: a word for None, [] and booleans; else a number or YAML."""
    words = {"unset": None, "none": [], "on": True, "off": False}
    if text in words:
        return words[text]
    try:
        return float(text) if any(c in text for c in ".e") and not text.isalpha() else int(text)
    except ValueError:
        return yaml.safe_load(text)


def _per_model(text: str) -> dict[str, object]:
    pairs = re.findall(r"\b(" + "|".join(CATALOGUE) + r") ([^\s,;]+)", text)
    return {model: _plain(value) for model, value in pairs}


@pytest.mark.parametrize("command", ["train", "submit"])
def test_every_default_train_and_submit_show_is_the_one_a_job_gets(command):
    shown = defaults_shown(_subparser(command))
    expected = {f.field for f in JOB_FLAGS} | ({f.field for f in LOCAL_FLAGS} if command == "train" else set())
    assert set(shown) == expected
    base = load_spec(overrides={"data": "d"})
    for field, text in shown.items():
        if field == "data":  # required, no default to show
            assert "(default" not in text
            continue
        default = _shown(text)
        if field == "name":
            assert default == "job-<random>" and re.fullmatch(r"job-[0-9a-f]{8}", base.name)
        elif field == "out":
            assert default == "runs/<name>" and base.out_location == f"runs/{base.name}"
        elif field == "stop.max_epochs":
            for workers in (1, 3):
                assert load_spec(overrides={"data": "d", "workers": workers}).epoch_limit(True) == 100 * workers
            assert default.startswith("100 × workers with a validation split")
            for model, epochs in _per_model(default.split("without one")[1]).items():
                assert load_spec(overrides={"data": "d", "model": model}).epoch_limit(False) == epochs
        elif field == "stop.eval_every":
            assert "50 with target_val" in default and base.stop.eval_every is None
            assert load_spec(overrides={"data": "d", "stop.target_val": 1.0}).stop.eval_every == 50
        elif field == "round_steps":
            assert default == "no limit" and base.round_steps is None
        elif "shown_default" in (field_info(JobSpec, field).json_schema_extra or {}):  # the model's default
            per_model = _per_model(default.split(";")[0])
            assert per_model and set(per_model) <= set(CATALOGUE), default
            for model, value in per_model.items():
                spec = load_spec(overrides={"data": "d", "model": model})
                if field.split(".")[-1] in CATALOGUE[model].auto:  # computed from the data: left unset here
                    assert value == "auto" and _value(spec, field) is None, (field, model)
                    assert f"{model} auto ({CATALOGUE[model].auto[field.split('.')[-1]]})" in default
                    continue
                assert _value(spec, field) == value, (field, model)
            if field == "hyper.lr":  # and SGD's own default where Adam's means something else
                sgd = load_spec(overrides={"data": "d", "hyper.optimizer": "sgd_momentum"})
                assert f"pmf with sgd_momentum {sgd.hyper.lr:g}" in default
        else:
            assert _value(base, field) == _plain(default), (field, default)


def test_every_default_prepare_shows_is_prepare_datasets_and_the_specs():
    from ebb.data.prepare import prepare_dataset

    shown = defaults_shown(_subparser("prepare"))
    base = PrepareSpec(format="csv", input="x")
    signature = inspect.signature(prepare_dataset).parameters
    assert set(shown) == set(PrepareSpec.model_fields)
    for field, text in shown.items():
        if field in ("format", "input"):
            assert "(default" not in text
            continue
        assert getattr(base, field) == _plain(_shown(text)), field
        assert signature[field].default == getattr(base, field), field  # one source of prepare's defaults


def test_set_reaches_any_field_with_a_yaml_value_and_names_the_field_on_error(tmp_path):
    spec = load_spec(
        overrides={"data": "d", "workers": 4},
        assignments=[
            "scaling.knee_min_drop=0.2",
            "stop.max_epochs=null",
            "faults.on_worker_loss=fail",
            "scaling.schedule=[{epoch: 2, workers: 2}]",
            "sync.quantize=false",
        ],
    )
    assert spec.scaling.knee_min_drop == 0.2 and spec.stop.max_epochs is None and spec.faults.on_worker_loss == "fail"
    assert spec.scaling.schedule[0].workers == 2 and spec.sync.quantize is False
    job = tmp_path / "job.yaml"
    job.write_text("data: d\nstop:\n  max_epochs: 3\n")
    assert load_spec(job, assignments=["stop.max_epochs=7"]).stop.max_epochs == 7  # over the file
    with pytest.raises(SpecError, match=r"^command line: stop.patience_evalz: unknown field$"):
        load_spec(overrides={"data": "d"}, assignments=["stop.patience_evalz=3"])
    with pytest.raises(SpecError, match=r"^command line: workers: Input should be a valid integer"):
        load_spec(overrides={"data": "d"}, assignments=["workers=many"])
    with pytest.raises(SpecError, match=r"^command line: --set stop: expected FIELD=VALUE"):
        load_spec(overrides={"data": "d"}, assignments=["stop"])
    with pytest.raises(SpecError, match=r"^command line: workers.x: workers is a value, not a section"):
        load_spec(overrides={"data": "d", "workers": 2}, assignments=["workers.x=1"])
    with pytest.raises(SpecError, match=r"^command line: workers: Input should be a valid integer"):
        load_spec(overrides={"data": "d"}, assignments=["workers.x=1"])


def test_the_cli_takes_set_and_the_common_fields(tmp_path, capsys):
    from ebb.flags import given

    args = build_parser().parse_args(
        [
            "train",
            "--data",
            "d",
            "--l2",
            "0.05",
            "--lr-decay",
            "0.9",
            "--momentum",
            "0.5",
            "--patience-evals",
            "8",
            "--target-val",
            "0.85",
            "--set",
            "stop.min_delta=0.01",
        ]
    )
    spec = load_spec(overrides=given(args, JOB_FLAGS + LOCAL_FLAGS), assignments=args.assignments)
    assert (spec.hyper.l2, spec.hyper.lr_decay, spec.hyper.momentum) == (0.05, 0.9, 0.5)
    assert (spec.stop.patience_evals, spec.stop.target_val, spec.stop.min_delta) == (8, 0.85, 0.01)
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--data", str(tmp_path), "--target-test", "0.8"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().endswith("--target-test was renamed to --target-val")


def test_a_job_file_with_target_test_is_told_it_was_renamed(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("data: d\nstop:\n  patience_evals: 3\n  target_test: 0.8\n")
    with pytest.raises(SpecError) as err:
        load_spec(job)
    assert str(err.value) == f"{job}:4: stop.target_test: renamed to stop.target_val"


def test_one_default_everywhere_for_the_supervisors_memory_the_clock_and_the_tuner():
    from ebb.autotune.knee import KneeDetector
    from ebb.autotune.tuner import ScaleInTuner
    from ebb.cost.model import Usage
    from ebb.engine.fleet_clock import Links

    deployed = json.loads((ROOT / "cdk.json").read_text())["context"]["ebb:supervisorMemoryMb"]
    assert field_default(AwsSpec, "supervisor_memory_mb") == deployed == Usage().supervisor_memory_mb
    assert (
        field_default(AwsSpec, "memory_mb")
        == json.loads((ROOT / "cdk.json").read_text())["context"]["ebb:workerMemoryMb"]
    )
    assert Links() == Links.of(ClockSpec())
    scaling, tuner, knee = ScalingSpec(), ScaleInTuner(), KneeDetector()
    assert (tuner.interval_s, tuner.horizon_s, tuner.tolerance, tuner.throughput_tolerance) == (
        scaling.interval_s,
        scaling.horizon_s,
        scaling.tolerance,
        scaling.throughput_tolerance,
    )
    assert (knee.tolerance, knee.patience, knee.min_drop) == (
        scaling.knee_tolerance,
        scaling.knee_patience,
        scaling.knee_min_drop,
    )
