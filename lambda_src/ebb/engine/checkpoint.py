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
in a ``meta`` byte array, with a sha256 of every other array (``meta["sha256"]``). A file
that cannot be decoded or does not match its checksum is a :class:`CheckpointError`
naming it: the job stops there rather than going on without that worker.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from ebb.engine.errors import CheckpointError
from ebb.engine.state import SupervisorState
from ebb.ports.keys import LATEST_KEY, round_of, supervisor_key
from ebb.ports.objects import ObjectStore

if TYPE_CHECKING:
    import numpy as np


def arrays_digest(arrays: dict[str, np.ndarray]) -> str:
    """sha256 of named arrays: names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = arrays[name]
        digest.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def write_worker(store: ObjectStore, key: str, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
    """Write a worker's state, its checksum in its metadata; returns its size in bytes."""
    import numpy as np  # here, not above: the light Lambda functions read only the JSON files

    from ebb.data.format import encode_batch

    meta = {**meta, "sha256": arrays_digest(arrays)}
    blob = encode_batch({**arrays, "meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)})
    store.put(key, blob)
    return len(blob)


def read_worker(store: ObjectStore, key: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A worker's state; a :class:`CheckpointError` naming the file if it is missing, cannot
    be decoded or does not match the checksum in its metadata."""
    from ebb.data.format import decode_batch

    try:
        raw = store.get(key)
    except KeyError:
        raise CheckpointError(f"checkpoint {store.locate(key)} is missing") from None
    try:
        arrays = decode_batch(raw)
        meta = json.loads(arrays.pop("meta").tobytes())
        if not isinstance(meta, dict):
            raise ValueError("its metadata is not an object")
    except Exception as exc:  # zipfile's CRC, numpy's header, JSON: whichever notices first
        raise _corrupt(store, key, f"{type(exc).__name__}: {exc}") from None
    if "sha256" in meta and meta["sha256"] != arrays_digest(arrays):
        raise _corrupt(store, key, "its arrays do not match the checksum in its metadata")
    return meta, arrays


def _corrupt(store: ObjectStore, key: str, why: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {store.locate(key)} is corrupt ({why[:120]}); the job cannot continue from it: "
        "start it again, or restore the file"
    )


def write_supervisor(store: ObjectStore, round_: int, state: SupervisorState) -> None:
    store.put(supervisor_key(round_), state.model_dump_json().encode())


def read_supervisor(store: ObjectStore, round_: int) -> SupervisorState:
    key = supervisor_key(round_)
    try:
        raw = store.get(key)
    except KeyError:
        raise CheckpointError(f"checkpoint {store.locate(key)} is missing") from None
    try:
        return SupervisorState.model_validate_json(raw)
    except ValueError as exc:  # pydantic's ValidationError included
        raise _corrupt(store, key, f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None


def latest(store: ObjectStore) -> dict[str, Any] | None:
    """The last complete round (``{"round", "finished", "workers"}``), or None before the first."""
    try:
        raw = store.get(LATEST_KEY)
    except KeyError:
        return None
    try:
        done = json.loads(raw)
        if not isinstance(done, dict) or not isinstance(done.get("round"), int):
            raise ValueError("not a round's commit")
    except ValueError as exc:
        raise _corrupt(store, LATEST_KEY, f"{type(exc).__name__}: {exc}") from None
    return done


def commit_round(store: ObjectStore, round_: int, *, finished: bool, workers: list[int]) -> None:
    """Declare round ``round_`` complete (every file of it is written), then drop older rounds."""
    store.put(LATEST_KEY, json.dumps({"round": round_, "finished": finished, "workers": sorted(workers)}).encode())
    for key in store.list("round-"):
        older = round_of(key)
        if older is not None and older < round_:
            store.delete(key)
