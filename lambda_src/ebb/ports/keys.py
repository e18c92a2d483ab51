"""The names of what the engine's parts share in their stores: one place for each.

In the **update store** (per job, gone when the job ends): replicas passed between
workers, markers the supervisor leaves for its workers, and the supervisor's heartbeat
slot. In the **checkpoint store** (``OUT/checkpoints`` locally, ``checkpoints/<job>/`` on
AWS; docs/ARCHITECTURE.md, "Checkpoint layout"): the spec, each round's worker and
supervisor state, the commit marker and the best replica validation kept. In a
**dataset**: the manifest and the minibatch parts. In a job's **outputs**: the report,
the model, the plot and the progress file.
"""

from __future__ import annotations

# -- the update store ----------------------------------------------------------------
ABORT_BLOB = "abort"  # set by a supervisor that gave its round up: the waiting workers leave
SUPERVISOR_SLOT = -1  # the supervisor's heartbeat slot (workers use their ids)


def replica_blob(worker: int, step: int) -> str:
    """A worker's replica as of step ``step``'s barrier (an evicted worker's, or a donor's)."""
    return f"replica:{worker}:{step}"


def lost_blob(worker: int) -> str:
    """Set by the supervisor when it gives up on a worker: should it come back, it leaves."""
    return f"lost:{worker}"


# -- the checkpoint store -------------------------------------------------------------
SPEC_KEY = "spec.json"  # the job spec the checkpoints belong to
LATEST_KEY = "latest.json"  # the last complete round: written last, the round's commit
BEST_REPLICA_KEY = "best.npz"  # the best replica a validation scoring kept ...
BEST_META_KEY = "best.json"  # ... and where it was and what it scored


def round_prefix(round_: int) -> str:
    return f"round-{round_:06d}/"


def worker_key(round_: int, worker: int) -> str:
    """Worker ``worker``'s state after round ``round_``."""
    return f"{round_prefix(round_)}worker-{worker:06d}.npz"


def supervisor_key(round_: int) -> str:
    """The supervisor's state after round ``round_``."""
    return f"{round_prefix(round_)}supervisor.json"


def round_of(key: str) -> int | None:
    """The round a checkpoint key belongs to (``round-000003/...`` -> 3), or None."""
    head = key.split("/", 1)[0]
    if not head.startswith("round-") or not head[6:].isdigit():
        return None
    return int(head[6:])


# -- a prepared dataset ---------------------------------------------------------------
MANIFEST_KEY = "manifest.json"  # written last: its presence means the dataset is complete


def part_key(split: str, index: int) -> str:
    """Object key of minibatch ``index`` of ``split`` ("train", "val" or "test")."""
    return f"{split}/part-{index:06d}"


# -- a job's outputs ------------------------------------------------------------------
REPORT_KEY = "report.json"  # after the model, before the plot: it lists only what is written
MODEL_KEY = "model.npz"
PLOT_KEY = "loss.png"
PROGRESS_KEY = "progress.json"  # a running job's latest step (ebb watch)
LOCK_KEY = "lock.json"  # the job that owns the folder now (pid, host): created only if absent

# -- the model artifact (beside model.npz; ebb.engine.artifact writes it, ebb.predict reads it)
MODEL_META_KEY = "model.json"  # what the model is and how to score a raw row with it
ID_MAP_COPY_KEY = "id_map.npz"  # MovieLens: the dataset's id maps, copied beside the model
SEEN_KEY = "seen.npz"  # MovieLens: each user's rated items (train + val), CSR over users
OUTPUT_KEYS = (REPORT_KEY, MODEL_KEY, PLOT_KEY, PROGRESS_KEY, MODEL_META_KEY, ID_MAP_COPY_KEY, SEEN_KEY)
