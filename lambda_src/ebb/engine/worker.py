"""The worker loop (DESIGN §1 step 2, MLLess §3).

At step t a worker: fetches its minibatch → computes a local update → runs the
significance filter (ISP) → publishes what is significant → announces the step (or
announces it *empty*) → waits until the supervisor's clock allows it to go on → pulls
the other workers' updates of every cleared step and applies them → acts on the
supervisor's directive (continue, evict, join, stop).

* BSP / ISP: the clock must reach t itself (a barrier). A worker's own update is applied
  at the barrier together with the others', in worker-id order, so every replica adds
  the same numbers in the same order: ISP with v = 0 is BSP bit for bit.
* SSP with slack s: the worker applies its own update at once and may start step t+1
  while the slowest worker has finished step ≥ t − s; it applies everyone's update of a
  step as soon as the step is cleared.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from ebb.data.format import MANIFEST_KEY, Manifest, checksum, decode_batch, encode_batch
from ebb.engine.aggregate import RowMean
from ebb.engine.isp import SignificanceFilter
from ebb.engine.striping import PartSequence, position_of
from ebb.models import Model, build_model
from ebb.sparse import RowUpdate
from ebb.spec import JobSpec
from ebb.stores.base import ObjectStore, SignalChannel, UpdateStore

BLOB_WAIT_S = 120.0  # how long to wait for a peer's replica before calling the job broken
DIRECTIVE_WAIT_S = 600.0  # a supervisor silent this long is gone


class EngineError(RuntimeError):
    pass


@dataclass
class WorkerStart:
    """Where a worker starts: at step 0 with everyone, or later as a joiner."""

    worker: int
    members: list[int]
    step: int = 0
    cursor: int = 0
    donor_blob: str | None = None  # replica to copy before the first step (a joining worker)


def replica_blob(worker: int, step: int) -> str:
    return f"replica:{worker}:{step}"


def final_blob(worker: int) -> str:
    return f"final:{worker}"


def load_manifest(objects: ObjectStore) -> Manifest:
    try:
        return Manifest.from_json(objects.get(MANIFEST_KEY).decode())
    except KeyError:
        raise EngineError("no manifest.json in the dataset: prepare it with `ebb prepare` first") from None


class PartCache:
    """Training parts, verified against the manifest and converted once per worker (LRU)."""

    def __init__(self, objects: ObjectStore, manifest: Manifest, model: Model, split: str = "train", capacity: int = 4096):
        self.objects, self.model, self.capacity = objects, model, capacity
        self.infos = (manifest.train if split == "train" else manifest.test).parts
        self._cache: OrderedDict[int, object] = OrderedDict()
        self.gets = 0  # object-store reads since last asked (S3 GETs on AWS)

    def get(self, index: int):
        batch = self._cache.get(index)
        if batch is not None:
            self._cache.move_to_end(index)
            return batch
        info = self.infos[index]
        raw = self.objects.get(info.key)
        self.gets += 1
        if checksum(raw) != info.sha256:
            raise EngineError(f"dataset part {info.key} does not match its checksum in manifest.json")
        batch = self.model.to_batch(decode_batch(raw))
        self._cache[index] = batch
        if len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return batch


@dataclass
class StepTimer:
    spans: dict[str, float] = field(default_factory=dict)
    _t: float = 0.0

    def start(self) -> None:
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.spans[name] = self.spans.get(name, 0.0) + now - self._t
        self._t = now

    def take(self) -> dict[str, float]:
        out, self.spans = self.spans, {}
        return out


class Worker:
    def __init__(self, spec: JobSpec, start: WorkerStart, objects: ObjectStore, updates: UpdateStore,
                 signals: SignalChannel, model: Model | None = None):
        self.spec, self.me = spec, start.worker
        self.objects, self.updates, self.signals = objects, updates, signals
        self.manifest = load_manifest(objects)
        self.model = model or build_model(spec.model, self.manifest, spec.hyper, spec.seed)
        self.parts = PartCache(objects, self.manifest, self.model)
        self.sequence = PartSequence(len(self.manifest.train.parts), spec.seed)
        self.mode = spec.sync.mode if len(start.members) > 1 or spec.scaling.policy == "schedule" else "bsp"
        self.slack = spec.sync.slack if self.mode == "ssp" else 0
        self.filter = (SignificanceFilter(self.model.params, spec.sync.significance, spec.sync.quantize)
                       if self.mode == "isp" else None)
        self.row_mean = RowMean(self.model.params)
        self.members, self.step, self.cursor = sorted(start.members), start.step, start.cursor
        self.clock = start.step - 1  # every step before ours is cleared
        self.applied_upto = start.step - 1
        self.base_lr = self.model.optimizer.lr
        self.own: dict[int, RowUpdate] = {}  # own updates awaiting their barrier (BSP / ISP)
        self.events: dict[int, dict] = {}  # directives by step
        self.timer = StepTimer()
        self.bytes_read = 0
        self._cpu_mark = time.process_time()
        self.sync_overhead_s: float | None = None
        self._announce_s = 0.0
        self._next_members: list[int] | None = None
        self._test_result: dict | None = None
        self._test_parts: PartCache | None = None
        if start.donor_blob:
            self._adopt_replica(start.donor_blob)

    # -- helpers -------------------------------------------------------------------
    def _wait_blob(self, name: str) -> bytes:
        deadline = time.monotonic() + BLOB_WAIT_S
        while (blob := self.updates.get_blob(name)) is None:
            if time.monotonic() > deadline:
                raise EngineError(f"worker {self.me}: replica {name!r} never arrived")
            time.sleep(0.002)
        return blob

    def _adopt_replica(self, name: str) -> None:
        arrays = decode_batch(self._wait_blob(name))
        for n, p in self.model.params.items():
            p.copy_(torch.from_numpy(arrays[n]))

    def _set_lr(self, position: int) -> None:
        epoch = position // self.sequence.num_parts
        lr = self.base_lr * self.spec.hyper.lr_decay ** epoch
        if self.spec.scaling.scale_lr and len(self.members) < self.spec.workers:
            # Linear scaling rule: a row's step is the mean of its touchers' proposals, so
            # a smaller fleet would take equally long but noisier steps and settle on a
            # higher loss. MLLess's summed updates shrink with the fleet the same way.
            lr *= len(self.members) / self.spec.workers
        self.model.optimizer.lr = lr

    def _receive(self, directive: dict) -> None:
        self.events[directive["step"]] = directive
        self.clock = max(self.clock, directive["step"])
        if "last_sent_at" in directive and directive["step"] == self.step:
            self.sync_overhead_s = self._announce_s + (time.monotonic() - directive["last_sent_at"])

    # -- the loop ------------------------------------------------------------------
    def run(self) -> str:
        """Train until the supervisor says stop (→ "stopped") or evicts us (→ "evicted")."""
        while True:
            self._compute_and_publish()
            self._wait_for_clock()
            outcome = self._apply_cleared()
            if outcome:
                return outcome

    def _compute_and_publish(self) -> None:
        t = self.step
        self.timer.start()
        position = position_of(self.cursor, self.members, self.me)
        self._set_lr(position)
        batch = self.parts.get(self.sequence.part_at(position))
        self.timer.lap("fetch")
        loss_sum, samples, update = self.model.local_update(batch)
        self.timer.lap("compute")
        sent = self.filter(update, self.model.params, t) if self.filter else update
        self.timer.lap("filter")
        empty = sent.is_empty()
        if len(self.members) == 1:
            payload = b""  # alone: nobody to read it
        elif self.filter:
            # ISP ships the significant entries plus the rows it touched, so every reader
            # divides each row by the same toucher count BSP would (see engine.aggregate).
            payload = sent.encode()
        else:
            payload = b"" if empty else sent.encode()
        if payload:
            self.updates.publish(t, self.me, payload)
        self.timer.lap("write")
        if self.mode == "ssp":
            self.model.apply(update)  # read your own writes; corrected to the step's mean when it clears
        self.own[t] = update
        self.timer.lap("apply")
        before = time.monotonic()
        cpu, self._cpu_mark = time.process_time() - self._cpu_mark, time.process_time()
        self.signals.report({
            "type": "step", "w": self.me, "t": t, "loss_sum": loss_sum, "n": samples, "empty": empty,
            "sent_bytes": len(payload), "sent_nnz": sent.nnz(), "local_nnz": update.nnz(),
            "read_bytes": self.bytes_read, "applied": self.applied_upto, "position": position,
            "timing": self.timer.take(), "cpu_s": cpu, "sync_s": self.sync_overhead_s, "sent_at": before,
            "object_gets": self.parts.gets, "test": self._test_result, "expect": len(self.members),
        })
        self.parts.gets = 0
        self._test_result = None
        self._announce_s = time.monotonic() - before
        self.bytes_read, self.sync_overhead_s = 0, None

    def _wait_for_clock(self) -> None:
        self.timer.start()
        need = self.step - self.slack
        # Under SSP directives pile up while we compute; under a barrier ours cannot be there yet.
        while self.slack and (d := self.signals.next_directive(self.me, 0)) is not None:
            self._receive(d)
        while self.clock < need:
            d = self.signals.next_directive(self.me, DIRECTIVE_WAIT_S)
            if d is None:
                raise EngineError(f"worker {self.me}: no word from the supervisor for {DIRECTIVE_WAIT_S:.0f} s")
            self._receive(d)
        self.timer.lap("wait")

    def _apply_cleared(self) -> str | None:
        for k in range(self.applied_upto + 1, self.clock + 1):
            members = self.members
            senders = self.events.get(k, {}).get("senders")
            # The directive names who sent something: empty announcers are not read at all.
            others = [q for q in members if q != self.me and (senders is None or q in senders)]
            payloads = self.updates.fetch(k, others) if others else {}
            self.bytes_read += sum(len(p) for p in payloads.values())
            self.timer.lap("read")
            own = self.own.pop(k, None)
            # Worker-id order, own update in its slot: every replica adds the same numbers.
            contributions = []
            for q in members:
                if q == self.me and own is not None:
                    contributions.append(own)
                elif q in payloads:
                    contributions.append(RowUpdate.decode(payloads[q]))
            self.row_mean.apply(self.model.params, contributions)
            if self.mode == "ssp" and own is not None:
                self.model.apply(own, scale=-1.0)  # it was applied at once; the mean replaces it
            self.timer.lap("apply")
            self.applied_upto = k
            self._maybe_evaluate(k)
            outcome = self._act_on(self.events.pop(k, {}), k)
            if outcome:
                return outcome
        # The step is done: the cursor moves on by the members that trained it.
        self.cursor += len(self.members)
        self.step += 1
        if self._next_members is not None:
            self.members, self._next_members = self._next_members, None
        return None

    def _maybe_evaluate(self, k: int) -> None:
        """Every ``eval_every`` steps the lowest-id worker scores its replica on the test split."""
        every = self.spec.stop.eval_every
        if not every or (k + 1) % every or self.me != self.members[0] or not self.manifest.test.parts:
            return
        started, cpu = time.perf_counter(), time.process_time()
        if self._test_parts is None:
            self._test_parts = PartCache(self.objects, self.manifest, self.model, split="test")
        metrics = self.model.evaluate(self._test_parts.get(i) for i in range(len(self.manifest.test.parts)))
        self._test_result = {"step": k, "metrics": metrics, "seconds": time.perf_counter() - started}
        self._cpu_mark += time.process_time() - cpu  # scoring is not training: kept out of cpu_s

    def _act_on(self, directive: dict, k: int) -> str | None:
        """Membership changes and stop, taken at the barrier after step k is applied."""
        if directive.get("stop"):
            self.updates.put_blob(final_blob(self.me), encode_batch(self.model.replica_arrays()))
            self.signals.report({"type": "final", "w": self.me, "t": k, "timing": self.timer.take(),
                                 "read_bytes": self.bytes_read})
            return "stopped"
        evicted = directive.get("evict", [])
        if self.me in evicted or self.me in directive.get("donors", []):
            self.updates.put_blob(replica_blob(self.me, k), encode_batch(self.model.replica_arrays()))
        if self.me in evicted:
            self.signals.report({"type": "left", "w": self.me, "t": k, "timing": self.timer.take(),
                                 "read_bytes": self.bytes_read, "pending_nnz": self.filter.pending_nnz() if self.filter else 0})
            return "evicted"
        for q in evicted:
            # MLLess §4.2: fold the leaver's replica in, so its unsent updates are not lost.
            self.model.average_in(decode_batch(self._wait_blob(replica_blob(q, k))))
        if "members" in directive:
            self._next_members = sorted(directive["members"])
        return None
