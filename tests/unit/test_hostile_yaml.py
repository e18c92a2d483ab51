"""YAML as people write it (issue 24, item 10): numbers in scientific notation without a dot
are numbers everywhere a number is read from YAML; a key given twice is refused with
``file:line``."""

from __future__ import annotations

import pytest

from ebb.cli import main
from ebb.spec import SpecError, load_spec


def _job(tmp_path, text: str, name: str = "job.yaml"):
    path = tmp_path / name
    path.write_text("model: pmf\ndata: x\n" + text)
    return path


@pytest.mark.parametrize(
    "text, field, value",
    [
        ("hyper:\n  l2: 3e-5\n", "l2", 3e-5),  # the README quotes l2 this way
        ("hyper:\n  lr: 2e-2\n", "lr", 0.02),
        ("hyper:\n  lr: 1E-1\n", "lr", 0.1),
        ("hyper:\n  init_std: +5e-2\n", "init_std", 0.05),
        ("hyper:\n  l2: 1_0e-6\n", "l2", 1e-5),
    ],
)
def test_scientific_notation_without_a_dot_is_a_number_in_a_job_file(tmp_path, text, field, value):
    assert getattr(load_spec(_job(tmp_path, text)).hyper, field) == pytest.approx(value)


def test_scientific_notation_is_a_number_in_set_values_and_prepare(tmp_path):
    spec = load_spec(
        _job(tmp_path, "prepare: {format: movielens, input: r.csv, val_fraction: 2e-1}\n"),
        assignments=["hyper.lr=1e-3", "stop.max_seconds=2e3", "prepare.test_fraction=5e-2"],
    )
    assert spec.prepare is not None
    assert (spec.hyper.lr, spec.stop.max_seconds, spec.prepare.test_fraction, spec.prepare.val_fraction) == (
        1e-3,
        2000.0,
        0.05,
        0.2,
    )


def test_a_number_in_scientific_notation_is_judged_as_a_number(tmp_path):
    """``lr: 1e9`` used to be the string "1e9" ("not a valid number"); now it is out of range."""
    with pytest.raises(SpecError, match=r"job.yaml:4: hyper.lr: Input should be less than or equal to 100"):
        load_spec(_job(tmp_path, "hyper:\n  lr: 1e9\n"))
    with pytest.raises(SpecError, match=r"job.yaml:3: workers: Input should be a valid integer"):
        load_spec(_job(tmp_path, "workers: 1e1\n"))
    # A float is not an integer, whatever its notation (as `workers: 2.5`).
    with pytest.raises(SpecError, match=r"job.yaml:3: prepare.num_features: Input should be a valid integer"):
        load_spec(_job(tmp_path, "prepare: {format: criteo, input: x.tsv, num_features: 1e5}\n"))
    # Names and other strings that look almost like numbers stay strings.
    assert load_spec(_job(tmp_path, "name: 1e9x\n")).name == "1e9x"


def test_a_key_given_twice_is_refused_with_its_line(tmp_path, capsys):
    path = _job(tmp_path, "hyper:\n  lr: 0.1\n  l2: 3e-5\n  lr: 0.2\n")
    with pytest.raises(SpecError) as bad:
        load_spec(path)
    assert str(bad.value) == f"{path}:6: not valid YAML: duplicate key 'lr' (first on line 4)"
    top = _job(tmp_path, "workers: 2\nseed: 1\nworkers: 3\n", "top.yaml")
    with pytest.raises(SpecError, match=r"top.yaml:5: not valid YAML: duplicate key 'workers' \(first on line 3\)"):
        load_spec(top)
    with pytest.raises(SpecError, match=r"command line: hyper: .* is not a YAML value \(duplicate key 'lr'"):
        load_spec(_job(tmp_path, "", "flags.yaml"), assignments=["hyper={lr: 0.1, lr: 0.2}"])
    assert main(["train", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"ebb train: {path}:6: not valid YAML: duplicate key 'lr' (first on line 4)"
    ]
