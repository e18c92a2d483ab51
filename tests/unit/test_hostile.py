"""Issue 24's hostile inputs that need no process: manifests of the wrong shape, values that
overflow their stored type, bounded dimensions, corrupt checkpoints (the whole commands are
in tests/integration/test_hostile_outputs.py)."""

from __future__ import annotations

import json

import pytest

from ebb.ports.manifest import Manifest

GOOD = {
    "format": "movielens",
    "kind": "ratings",
    "batch_size": 10,
    "seed": 0,
    "train": {"rows": 10, "parts": [{"key": "train/part-000000", "rows": 10, "sha256": "ab"}]},
    "test": {"rows": 0, "parts": []},
    "num_users": 3,
    "num_items": 4,
}


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda m: [], "expected an object, found list"),
        (lambda m: "test", "expected an object, found str"),
        (lambda m: {k: v for k, v in m.items() if k != "test"}, "'test' is missing"),
        (lambda m: {**m, "num_users": "500"}, 'num_users: expected int, found "500"'),
        (lambda m: {**m, "num_items": True}, "num_items: expected int, found true"),
        (lambda m: {**m, "train": {**m["train"], "parts": {}}}, "train.parts: expected list"),
        (lambda m: {**m, "train": {"rows": 1, "parts": [{"key": 3, "rows": 1, "sha256": ""}]}}, "train.parts[0].key"),
        (lambda m: {**m, "extra": 1}, "unknown field 'extra'"),
    ],
)
def test_a_manifest_of_the_wrong_shape_names_its_first_wrong_field(edit, expected):
    assert Manifest.from_json(json.dumps(GOOD)).num_users == 3
    with pytest.raises(ValueError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        Manifest.from_json(json.dumps(edit(GOOD)))
