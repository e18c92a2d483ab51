"""Checkpoints: everything a job needs to carry on in fresh processes (docs/ARCHITECTURE.md,
"Rounds and checkpoints"; ``ebb.ports.keys`` names the keys).

Layout in the checkpoint store (``OUT/checkpoints`` locally, ``s3://bucket/checkpoints/<job>``
on AWS)::

    spec.json                        the job spec the checkpoints belong to
    round-000003/worker-000001.npz   worker 1's state after round 3
    round-000003/supervisor.json     the supervisor's state after round 3
    latest.json                      {"round": 3, "finished": false, ...}: the last complete round

A round is complete only when ``latest.json`` names it: the supervisor writes it last,
after every worker of the round has reported its checkpoint written. A round cut short
(a crash, a kill) leaves at most a partial ``round-N/`` folder that nothing reads; the
next attempt resumes from the round ``latest.json`` names and overwrites it. Older rounds
are deleted once a newer one is complete.

A worker's file is an ``.npz`` of plain arrays (no pickle): its replica (``param.*``),
optimiser state (``opt.*``), ISP accumulators (``isp.*``) and its loop counters as JSON
in a ``meta`` byte array.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ebb.engine.errors import CheckpointError
from ebb.engine.state import SupervisorState
from ebb.ports.keys import LATEST_KEY, round_of, supervisor_key
from ebb.ports.objects import ObjectStore

if TYPE_CHECKING:
    import numpy as np


def write_worker(store: ObjectStore, key: str, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
    """Write a worker's state; returns its size in bytes."""
    import numpy as np  # here, not above: the light Lambda functions read only the JSON files

    from ebb.data.format import encode_batch

    blob = encode_batch({**arrays, "meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)})
    store.put(key, blob)
    return len(blob)


def read_worker(store: ObjectStore, key: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from ebb.data.format import decode_batch

    try:
        arrays = decode_batch(store.get(key))
    except KeyError:
        raise CheckpointError(f"checkpoint {key} is missing") from None
    meta = json.loads(arrays.pop("meta").tobytes())
    return meta, arrays


def write_supervisor(store: ObjectStore, round_: int, state: SupervisorState) -> None:
    store.put(supervisor_key(round_), state.model_dump_json().encode())


def read_supervisor(store: ObjectStore, round_: int) -> SupervisorState:
    try:
        raw = store.get(supervisor_key(round_))
    except KeyError:
        raise CheckpointError(f"checkpoint {supervisor_key(round_)} is missing") from None
    return SupervisorState.model_validate_json(raw)


def latest(store: ObjectStore) -> dict[str, Any] | None:
    """The last complete round (``{"round", "finished", "workers"}``), or None before the first."""
    try:
        return json.loads(store.get(LATEST_KEY))
    except KeyError:
        return None


def commit_round(store: ObjectStore, round_: int, *, finished: bool, workers: list[int]) -> None:
    """Declare round ``round_`` complete (every file of it is written), then drop older rounds."""
    store.put(LATEST_KEY, json.dumps({"round": round_, "finished": finished, "workers": sorted(workers)}).encode())
    for key in store.list("round-"):
        older = round_of(key)
        if older is not None and older < round_:
            store.delete(key)
