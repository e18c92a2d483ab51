"""A worker's training (or held-out) minibatches: read once, verified, converted, kept.

A *warm* process (``warm_up``: a trial pack's, whose fleet trains one trial after another
as warm Lambda environments would) holds the training split converted once, process-wide:
every ``PartCache`` of that data in it, or in a worker process forked from it, takes its
parts from there without reading (or paying for) them again.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ebb.data.format import checksum, decode_batch
from ebb.engine.errors import EngineError
from ebb.models import Model
from ebb.ports.keys import MANIFEST_KEY
from ebb.ports.manifest import Manifest, Split
from ebb.ports.objects import ObjectStore


def batch_nbytes(batch: Any) -> int:
    """Bytes of the tensors and arrays a converted minibatch holds (in dataclasses, tuples, lists, dicts)."""
    if isinstance(batch, torch.Tensor):
        return batch.element_size() * batch.nelement()
    if isinstance(batch, np.ndarray):
        return int(batch.nbytes)
    if isinstance(batch, dict):
        return sum(batch_nbytes(v) for v in batch.values())
    if isinstance(batch, (tuple, list)):
        return sum(batch_nbytes(v) for v in batch)
    if hasattr(batch, "__dataclass_fields__"):
        return sum(batch_nbytes(getattr(batch, name)) for name in batch.__dataclass_fields__)
    return 0


# (the model's batch type, the part's checksum) -> its converted batch; None: not warm.
_WARM: dict[tuple[str, str], Any] | None = None


def warm_up(objects: ObjectStore, manifest: Manifest, model: Model, max_bytes: int) -> dict[str, float] | None:
    """Read and convert the training split once for this process and those it forks (a
    warm fleet keeps its shard in memory); returns what that took: ``{"gets", "cpu_seconds",
    "bytes"}``, or None (nothing kept) when the split is over ``max_bytes`` (one worker's
    part cache: a function could not keep it, so each job reads its parts, and pays, again)."""
    global _WARM
    started = time.process_time()
    loader = PartCache(objects, manifest, model, split="train", max_bytes=0)  # (kept below, not in it)
    kept, held = {}, 0
    for i, info in enumerate(loader.infos):
        batch = loader.get(i)
        held += batch_nbytes(batch)
        if held > max_bytes:
            return None
        kept[(type(model).__name__, info.sha256)] = batch
    _WARM = {**(_WARM or {}), **kept}
    return {"gets": loader.gets, "cpu_seconds": time.process_time() - started, "bytes": held}


class PartCache:
    """The parts of one split, verified against the manifest and converted once (LRU).

    Bounded by bytes, not parts: minibatches are re-striped every epoch, so a worker
    visits every part in time, and a bound by count let each worker of a large job hold
    the whole converted dataset, past a Lambda function's memory.
    """

    def __init__(
        self, objects: ObjectStore, manifest: Manifest, model: Model, split: Split = "train", max_bytes: int = 256 << 20
    ):
        self.objects, self.model, self.max_bytes = objects, model, max_bytes
        self.infos = manifest.split(split).parts
        self._cache: OrderedDict[int, Any] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self.held_bytes = 0
        self.gets = 0  # object-store reads since last asked (S3 GETs on AWS)

    def get(self, index: int) -> Any:
        batch = self._cache.get(index)
        if batch is not None:
            self._cache.move_to_end(index)
            return batch
        info = self.infos[index]
        warm = _WARM.get((type(self.model).__name__, info.sha256)) if _WARM is not None else None
        if warm is not None:
            return self._keep(index, warm)
        raw = self.objects.get(info.key)
        self.gets += 1
        if checksum(raw) != info.sha256:
            raise EngineError(f"dataset part {info.key} does not match its checksum in {MANIFEST_KEY}")
        try:
            batch = self.model.to_batch(decode_batch(raw))
        except Exception as exc:
            raise EngineError(
                f"dataset part {info.key} cannot be read as a minibatch ({type(exc).__name__}: "
                f"{str(exc)[:120]}); prepare the dataset again"
            ) from None
        return self._keep(index, batch)

    def _keep(self, index: int, batch: Any) -> Any:
        size = batch_nbytes(batch)
        if size <= self.max_bytes:
            self._cache[index], self._sizes[index] = batch, size
            self.held_bytes += size
            while self.held_bytes > self.max_bytes:
                oldest, _ = self._cache.popitem(last=False)
                self.held_bytes -= self._sizes.pop(oldest)
        return batch

    def each(self) -> Iterator[Any]:
        """Every part of the split, in order (a held-out split, scored whole)."""
        return (self.get(i) for i in range(len(self.infos)))


def prime_for_scoring(objects: ObjectStore, manifest: Manifest, model: Model) -> None:
    """Give a model whose scoring depends on the training split (``needs_training_pass``)
    its one pass over it, streamed part by part (nothing kept)."""
    if model.needs_training_pass:
        model.observe_training(PartCache(objects, manifest, model, split="train", max_bytes=0).each())
        model.needs_training_pass = False
