"""What a prepared dataset holds (``manifest.json``), and the one place that reads it.

``ebb prepare`` writes the manifest last, so its presence means the dataset is complete:
format, kind, counts, dimensions, batch size, and a sha256 for every part of every split
(``train``, ``val``, ``test``; ``ports.keys.part_key`` names them).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from ebb.ports.keys import MANIFEST_KEY
from ebb.ports.objects import ObjectStore

SPLITS = ("train", "val", "test")
Split = Literal["train", "val", "test"]


class ManifestError(ValueError):
    """A dataset without a manifest, or with one that cannot be read (the message says
    where and what to do)."""


@dataclass
class PartInfo:
    key: str
    rows: int
    sha256: str


@dataclass
class SplitInfo:
    rows: int = 0
    parts: list[PartInfo] = field(default_factory=list)


@dataclass
class Manifest:
    """What a prepared dataset holds; written last, so its presence means complete."""

    format: str  # movielens | criteo | libsvm | csv
    kind: str  # ratings | sparse | dense
    batch_size: int
    seed: int
    train: SplitInfo
    test: SplitInfo
    # Held out for choosing hyper-parameters and when to stop; empty unless prepared with
    # a validation fraction (manifests written before it existed have none).
    val: SplitInfo = field(default_factory=SplitInfo)
    num_users: int = 0  # ratings
    num_items: int = 0  # ratings
    num_features: int = 0  # sparse / dense
    stats: dict[str, Any] = field(default_factory=dict)  # e.g. rating_mean, label_mean
    source: dict[str, Any] = field(default_factory=dict)  # input paths, options, skipped rows
    version: int = 1

    def split(self, name: Split) -> SplitInfo:
        info: SplitInfo = getattr(self, name)
        return info

    @property
    def has_val(self) -> bool:
        """Whether the dataset has a validation split (early stopping needs one)."""
        return bool(self.val.parts)

    @property
    def held_out_split(self) -> Literal["val", "test"]:
        """What is scored during training: the validation split, or the test split standing
        in when the data has none."""
        return "val" if self.has_val else "test"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """The manifest in ``text``; a ``ValueError`` naming the first field of the wrong
        shape or type (``num_users: "500"`` is not a number of users)."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"expected an object, found {type(raw).__name__}")
        for name in ("format", "kind", "batch_size", "seed", "train", "test"):
            if name not in raw:
                raise ValueError(f"{name!r} is missing")
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(raw) - known):
            raise ValueError(f"unknown field {unknown[0]!r}")
        for name, kind in _FIELD_TYPES.items():
            if name in raw:
                _check(raw[name], kind, name)
        for split in SPLITS:
            if split in raw:  # no "val" in manifests written before it existed
                s = raw[split]
                _check(s, dict, split)
                _check(s.get("rows"), int, f"{split}.rows")
                _check(s.get("parts"), list, f"{split}.parts")
                parts = []
                for i, p in enumerate(s["parts"]):
                    at = f"{split}.parts[{i}]"
                    _check(p, dict, at)
                    for name, kind in (("key", str), ("rows", int), ("sha256", str)):
                        _check(p.get(name), kind, f"{at}.{name}")
                    parts.append(PartInfo(key=p["key"], rows=p["rows"], sha256=p["sha256"]))
                raw[split] = SplitInfo(rows=s["rows"], parts=parts)
        return cls(**raw)


_FIELD_TYPES: dict[str, type] = {
    "format": str,
    "kind": str,
    "batch_size": int,
    "seed": int,
    "num_users": int,
    "num_items": int,
    "num_features": int,
    "stats": dict,
    "source": dict,
    "version": int,
}


def _check(value: Any, kind: type, where: str) -> None:
    """``value`` is a ``kind`` (an int is never a bool, and never a string of digits)."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}: expected {kind.__name__}, found {json.dumps(value)[:40]}")


def load_manifest(store: ObjectStore, where: str = "the dataset") -> Manifest:
    """The manifest of the dataset in ``store`` (``where`` names it in an error)."""
    try:
        raw = store.get(MANIFEST_KEY)
    except KeyError:
        raise ManifestError(f"{where} has no {MANIFEST_KEY}; prepare it first with `ebb prepare`") from None
    try:
        return Manifest.from_json(raw.decode())
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ManifestError(
            f"{where}/{MANIFEST_KEY} is corrupt ({type(exc).__name__}: {str(exc)[:200]}); prepare the dataset again"
        ) from None
