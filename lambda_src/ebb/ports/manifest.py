"""What a prepared dataset holds (``manifest.json``), and the one place that reads it.

``ebb prepare`` writes the manifest last, so its presence means the dataset is complete:
format, kind, counts, dimensions, batch size, and a sha256 for every part of every split
(``train``, ``val``, ``test``; ``ports.keys.part_key`` names them).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
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
        raw = json.loads(text)
        for split in SPLITS:
            if split in raw:  # no "val" in manifests written before it existed
                s = raw[split]
                raw[split] = SplitInfo(rows=s["rows"], parts=[PartInfo(**p) for p in s["parts"]])
        return cls(**raw)


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
            f"{where}/{MANIFEST_KEY} is corrupt ({type(exc).__name__}: {exc}); prepare the dataset again"
        ) from None
