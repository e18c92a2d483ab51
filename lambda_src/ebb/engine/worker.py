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

A worker runs for one *round* (DESIGN §6). When a directive names the round's last step
R, the worker trains no step past R; once R is applied it writes its checkpoint —
replica, optimiser state, ISP accumulators, loop counters — and ends "unfinished". The
next round's worker (a fresh process, or a fresh Lambda invocation) resumes from it.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from ebb.data.format import MANIFEST_KEY, Manifest, checksum, decode_batch, encode_batch
from ebb.engine import checkpoint
from ebb.engine.aggregate import RowMean
from ebb.engine.clock import wall
from ebb.engine.isp import SignificanceFilter
from ebb.engine.messages import Directive, EndReport, StepReport
from ebb.engine.striping import PartSequence, position_of
from ebb.models import Model, build_model
from ebb.sparse import RowUpdate
from ebb.spec import JobSpec
from ebb.stores.base import ObjectStore, SignalChannel, UpdateStore

BLOB_WAIT_S = 120.0  # how long to wait for a peer's replica before calling the job broken
DIRECTIVE_WAIT_S = 600.0  # a supervisor silent this long is gone
WAIT_CHUNK_S = 1.0  # longest single blocking read: between them a worker notices it was cancelled


class EngineError(RuntimeError):
    pass


@dataclass
class WorkerStart:
    """Where a worker starts: at step 0 with everyone, later as a joiner, or from its
    checkpoint at the start of a later round (``resume``: the checkpoint's key)."""

    worker: int
    members: list[int]
    round: int = 0
    step: int = 0
    cursor: int = 0
    donor_blob: str | None = None  # replica to copy before the first step (a joining worker)
    resume: str | None = None


def replica_blob(worker: int, step: int) -> str:
    return f"replica:{worker}:{step}"


def held_out_split(manifest: Manifest) -> str:
    """What is scored during training: the validation split if the data has one, else test."""
    return "val" if manifest.val.parts else "test"


def eval_interval(spec: JobSpec, manifest: Manifest) -> int:
    """Steps between scorings of the held-out split (0: never). By default, when the data
    has a validation split (early stopping needs it), one worker's epoch of progress apart,
    so ``stop.patience_evals`` means the same at any fleet size (see ``default_eval_every``)."""
    if spec.stop.eval_every is not None:
        return spec.stop.eval_every
    if manifest.val.parts:
        return default_eval_every(spec, len(manifest.train.parts))
    return 0


def default_eval_every(spec: JobSpec, num_parts: int) -> int:
    """One worker's epoch of progress, in steps. Under ``sync.combine`` sum a step of the
    initial fleet adds its P workers' proposals, so that is an epoch (num_parts / P steps);
    under mean a step moves a row by about one worker's proposal, so it is num_parts steps
    (P epochs), the unit ``hyper.lr_decay`` counts in too. Scoring once an epoch under mean
    gave 4-worker PMF five flat scorings in the plateau every PMF run crosses early
    (ml-latest-small-shaped: stopped at epoch 9 with val RMSE 0.854; it reaches 0.832)."""
    if spec.sync.combine == "sum":
        return max(1, -(-num_parts // spec.workers))
    return max(1, num_parts)


BEST_KEY, BEST_META_KEY = "best.npz", "best.json"  # in the checkpoint store: the best scored replica


def lost_blob(worker: int) -> str:
    """Set by the supervisor when it gives up on a worker: should it come back, it leaves."""
    return f"lost:{worker}"


ABORT_BLOB = "abort"  # set by a supervisor that gave its round up: the waiting workers leave


class Lost(Exception):
    """The supervisor has given up on this worker (it stalled too long): leave quietly."""


HEARTBEAT_S = 1.0
SUPERVISOR = -1  # the supervisor's heartbeat slot in the update store


def sync_mode(spec: JobSpec) -> str:
    """The sync model the job's workers run: a job that starts alone (and never grows) is BSP."""
    return spec.sync.mode if spec.workers > 1 or spec.scaling.policy == "schedule" else "bsp"


def load_manifest(objects: ObjectStore) -> Manifest:
    try:
        return Manifest.from_json(objects.get(MANIFEST_KEY).decode())
    except KeyError:
        raise EngineError("no manifest.json in the dataset: prepare it with `ebb prepare` first") from None


def batch_nbytes(batch) -> int:
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


class PartCache:
    """Training parts, verified against the manifest and converted once per worker (LRU).

    Bounded by bytes, not parts: minibatches are re-striped every epoch, so a worker
    visits every part in time, and a count bound let each worker of a 1M-row sparse LR
    job hold the whole converted dataset (1.1 GB at 8 workers: a Lambda function of
    1,769 MB, or 24 local workers on 24 GB, ran out of memory).
    """

    def __init__(
        self, objects: ObjectStore, manifest: Manifest, model: Model, split: str = "train",
        max_bytes: int = 256 << 20,
    ):
        self.objects, self.model, self.max_bytes = objects, model, max_bytes
        self.infos = getattr(manifest, split).parts
        self._cache: OrderedDict[int, object] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self.held_bytes = 0
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
        try:
            batch = self.model.to_batch(decode_batch(raw))
        except Exception as exc:
            raise EngineError(
                f"dataset part {info.key} cannot be read as a minibatch ({type(exc).__name__}: "
                f"{str(exc)[:120]}); prepare the dataset again"
            ) from None
        size = batch_nbytes(batch)
        if size <= self.max_bytes:
            self._cache[index], self._sizes[index] = batch, size
            self.held_bytes += size
            while self.held_bytes > self.max_bytes:
                oldest, _ = self._cache.popitem(last=False)
                self.held_bytes -= self._sizes.pop(oldest)
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


def state_arrays(model: Model, isp: SignificanceFilter | None) -> dict:
    """What a worker's checkpoint holds besides its counters: replica (``param.*``),
    optimiser state (``opt.*``) and ISP accumulators (``isp.*``), as plain arrays."""
    arrays = model.state_arrays()
    if isp is not None:
        arrays.update({f"isp.{name}": acc.numpy() for name, acc in isp.pending.items()})
    return arrays


def load_state_arrays(model: Model, isp: SignificanceFilter | None, arrays: dict) -> None:
    model.load_state_arrays({k: v for k, v in arrays.items() if not k.startswith("isp.")})
    if isp is not None:
        for name, acc in isp.pending.items():
            acc.copy_(torch.from_numpy(arrays[f"isp.{name}"]))


class Worker:
    def __init__(
        self,
        spec: JobSpec,
        start: WorkerStart,
        *,
        data: ObjectStore,
        checkpoints: ObjectStore,
        updates: UpdateStore,
        signals: SignalChannel,
        model: Model | None = None,
    ):
        self.spec, self.me, self.round = spec, start.worker, start.round
        self.data, self.checkpoints, self.updates, self.signals = data, checkpoints, updates, signals
        self.manifest = load_manifest(data)
        self.model = model or build_model(spec.model, self.manifest, spec.hyper, spec.seed)
        self.parts = PartCache(data, self.manifest, self.model, max_bytes=spec.aws.part_cache_bytes())
        self.sequence = PartSequence(len(self.manifest.train.parts), spec.seed)
        self.mode = sync_mode(spec)
        self.slack = spec.sync.slack if self.mode == "ssp" else 0
        self.filter = (
            SignificanceFilter(self.model.params, spec.sync.significance, spec.sync.quantize)
            if self.mode == "isp"
            else None
        )
        self.row_mean = RowMean(self.model.params, spec.sync.combine, spec.sync.sum_cap)
        self.members, self.step, self.cursor = sorted(start.members), start.step, start.cursor
        self.base_lr = self.model.optimizer.lr
        if start.resume:
            self._restore(start.resume)
        self.clock = self.step - 1  # every step before ours is cleared
        self.applied_upto = self.step - 1
        self.round_end: int | None = None  # the round's last step, once a directive names it
        self.own: dict[int, RowUpdate] = {}  # own updates awaiting their barrier (BSP / ISP)
        self.events: dict[int, Directive] = {}  # directives by step
        self.timer = StepTimer()
        self.bytes_read = 0
        self.requests = 0  # update-store round trips since the last report (the fleet clock's rtt term)
        self.io_cpu = 0.0  # CPU inside the update store's calls since the last report (overlaps the wire)
        self._cpu_mark = time.process_time()
        self.sync_overhead_s: float | None = None
        self._announce_s = 0.0
        self._next_members: list[int] | None = None
        self._test_result: dict | None = None
        self._test_parts: PartCache | None = None
        self._eval_every = eval_interval(spec, self.manifest)
        self._best: float | None = None
        self.cancelled = threading.Event()  # set by an in-process launcher tearing the job down
        if start.donor_blob:
            self._adopt_replica(start.donor_blob)

    # -- checkpoints ---------------------------------------------------------------
    def _restore(self, key: str) -> None:
        meta, arrays = checkpoint.read_worker(self.checkpoints, key)
        if meta["worker"] != self.me or meta["job"] != self.spec.name or meta["model"] != self.spec.model:
            raise checkpoint.CheckpointError(
                f"checkpoint {key} belongs to worker {meta['worker']} of job {meta['job']} ({meta['model']}), "
                f"not to worker {self.me} of job {self.spec.name} ({self.spec.model})"
            )
        if meta["mode"] != self.mode:
            raise checkpoint.CheckpointError(
                f"worker {self.me}'s checkpoint was written under sync mode {meta['mode']} but the job now runs "
                f"{self.mode}; resume with the spec the job started with"
            )
        load_state_arrays(self.model, self.filter, arrays)
        self.step, self.cursor, self.members = meta["step"], meta["cursor"], sorted(meta["members"])

    def _write_checkpoint(self, outcome: str) -> str:
        key = checkpoint.worker_key(self.round, self.me)
        arrays = state_arrays(self.model, self.filter)
        meta = {
            "worker": self.me,
            "job": self.spec.name,
            "model": self.spec.model,
            "mode": self.mode,
            "round": self.round,
            "step": self.step,
            "cursor": self.cursor,
            "members": self.members,
            "applied_upto": self.applied_upto,
            "outcome": outcome,
        }
        checkpoint.write_worker(self.checkpoints, key, meta, arrays)
        return key

    def _end(self, outcome: str, key: str | None = None, error: str | None = None) -> str:
        cpu, self._cpu_mark = time.process_time() - self._cpu_mark, time.process_time()
        self.signals.report(
            EndReport(
                worker=self.me,
                step=self.applied_upto,
                round=self.round,
                outcome=outcome,
                checkpoint=key,
                error=error,
                read_bytes=self.bytes_read,
                cpu_seconds=cpu,
                object_gets=self.parts.gets,
                timing=self.timer.take(),
                pending_nnz=self.filter.pending_nnz() if self.filter and outcome == "evicted" else 0,
            )
        )
        return outcome

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

    def _set_lr(self) -> None:
        # The decay follows steps, not passes over the data: once every `minibatches` steps
        # (an epoch at one worker). A step moves a row by the mean of its touchers'
        # proposals, about as far as one worker's step, so at P workers an epoch advances
        # the model about as much as 1/P of one worker's epoch; decaying per epoch froze an
        # 8-worker job before it had converged.
        # (Under sync.combine sum an epoch at P workers is one worker's epoch of progress, so
        # the decay is once per num_parts / P steps of the initial fleet: default_eval_every.)
        period = default_eval_every(self.spec, self.sequence.num_parts)
        lr = self.base_lr * self.spec.hyper.lr_decay ** (self.step // period)
        if self.spec.scaling.scale_lr and len(self.members) < self.spec.workers and self.spec.sync.combine == "mean":
            # Linear scaling rule (off by default): a row's step is the mean of its
            # touchers' proposals, so a smaller fleet takes equally long but noisier steps.
            # On the fleet clock the rows most workers touch were not what limited PMF
            # after the knee: scaling slowed every row and cost the tuner's jobs 4-8% of
            # their time (docs/RESULTS.md). Summed updates shrink with the fleet by themselves.
            lr *= len(self.members) / self.spec.workers
        self.model.optimizer.lr = lr

    def _receive(self, directive: Directive) -> None:
        if directive.step <= self.applied_upto:
            return  # delivered twice (at-least-once channels): applied already
        self.events[directive.step] = directive
        self.clock = max(self.clock, directive.step)
        if directive.round_end is not None:
            self.round_end = directive.round_end
        if directive.last_sent_at is not None and directive.step == self.step:
            self.sync_overhead_s = self._announce_s + max(0.0, wall() - directive.last_sent_at)

    # -- the loop ------------------------------------------------------------------
    def run(self) -> str:
        """Train until the supervisor says stop (→ "stopped"), evicts us (→ "evicted") or
        ends the round (→ "unfinished", after writing the checkpoint). A failure is reported
        to the supervisor (its message, one line) before it is raised."""
        beating = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(beating,), name=f"ebb-heartbeat-{self.me}", daemon=True)
        beat.start()
        try:
            return self._run()
        except Lost:
            return "evicted"
        except Exception as exc:
            try:
                self._end("failed", error=f"{type(exc).__name__}: {exc}")
            except Exception:  # the channel itself may be what failed
                pass
            raise
        finally:
            beating.set()
            beat.join(timeout=5)  # not left running into interpreter shutdown

    def _heartbeat(self, stopped: threading.Event) -> None:
        """Tell the supervisor we are alive, every second, whatever the training loop does."""
        while not stopped.is_set():
            try:
                self.updates.heartbeat(self.me, wall())
            except Exception:  # the main loop meets the same store and reports it
                pass
            stopped.wait(HEARTBEAT_S)

    def _run(self) -> str:
        while True:
            training = self.round_end is None or self.step <= self.round_end
            if training:
                self._compute_and_publish()
                self._wait_for_clock(self.step - self.slack)
            else:  # the round's last step is trained: wait until everyone's is applied
                self._wait_for_clock(self.round_end)
            outcome = self._apply_cleared(advance=training)
            if outcome:
                return outcome
            if self.round_end is not None and self.applied_upto >= self.round_end:
                return self._end("unfinished", self._write_checkpoint("unfinished"))

    def _compute_and_publish(self) -> None:
        t = self.step
        self.timer.start()
        position = position_of(self.cursor, self.members, self.me)
        self._set_lr()
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
            io_mark = time.process_time()
            self.updates.publish(t, self.me, payload)
            self.io_cpu += time.process_time() - io_mark
            self.requests += 1
        self.timer.lap("write")
        if self.mode == "ssp":
            self.model.apply(update)  # read your own writes; corrected to the step's mean when it clears
        self.own[t] = update
        self.timer.lap("apply")
        before = time.perf_counter()
        cpu, self._cpu_mark = time.process_time() - self._cpu_mark, time.process_time()
        self.signals.report(
            StepReport(
                worker=self.me,
                step=t,
                members=self.members,
                round=self.round,
                loss_sum=loss_sum,
                samples=samples,
                empty=empty,
                sent_bytes=len(payload),
                sent_nnz=sent.nnz(),
                local_nnz=update.nnz(),
                read_bytes=self.bytes_read,
                applied_upto=self.applied_upto,
                position=position,
                cpu_seconds=cpu,
                io_cpu_seconds=self.io_cpu,
                sync_seconds=self.sync_overhead_s,
                sent_at=wall(),
                object_gets=self.parts.gets,
                requests=self.requests + 2,  # this announcement and the go that answers it
                timing=self.timer.take(),
                test=self._test_result,
            )
        )
        self.parts.gets = 0
        self._test_result = None
        self._announce_s = time.perf_counter() - before
        self.bytes_read, self.sync_overhead_s, self.requests, self.io_cpu = 0, None, 0, 0.0

    def _wait_for_clock(self, need: int) -> None:
        self.timer.start()
        # Under SSP directives pile up while we compute; under a barrier ours cannot be there yet.
        while self.slack and (d := self.signals.next_directive(self.me, 0)) is not None:
            self._receive(d)
        started = time.monotonic()
        deadline = started + DIRECTIVE_WAIT_S
        while self.clock < need:
            d = self.signals.next_directive(self.me, min(WAIT_CHUNK_S, max(0.001, deadline - time.monotonic())))
            if d is not None:
                self._receive(d)
            elif self.cancelled.is_set():
                raise EngineError(f"worker {self.me}: cancelled")
            elif time.monotonic() - started > self.spec.faults.worker_timeout_s:
                self._check_still_wanted(need, time.monotonic() - started)
            elif time.monotonic() > deadline:
                raise EngineError(
                    f"worker {self.me}: no word from the supervisor for {DIRECTIVE_WAIT_S:.0f} s "
                    f"(waiting for step {need}'s directive)"
                )
        self.timer.lap("wait")

    def _check_still_wanted(self, need: int, waited: float) -> None:
        """After a long wait: leave if the supervisor gave up on us, fail if it went silent."""
        if self.updates.get_blob(lost_blob(self.me)) is not None:
            raise Lost()
        if (why := self.updates.get_blob(ABORT_BLOB)) is not None:
            raise EngineError(f"worker {self.me}: the supervisor gave the round up ({why.decode(errors='replace')})")
        faults = self.spec.faults
        beat = self.updates.heartbeats([SUPERVISOR]).get(SUPERVISOR)
        silent = waited if beat is None else wall() - beat
        if silent > (faults.worker_timeout_s if beat is not None else faults.startup_timeout_s):
            raise EngineError(
                f"worker {self.me}: the supervisor went silent (nothing for {silent:.0f} s) while "
                f"this worker waited for step {need}'s directive"
            )

    def _apply_cleared(self, advance: bool) -> str | None:
        """Apply every cleared step; with ``advance``, our own step is done: move on."""
        for k in range(self.applied_upto + 1, self.clock + 1):
            members = self.members
            directive = self.events.pop(k, None)
            senders = directive.senders if directive is not None else None
            # The directive names who sent something: empty announcers are not read at all.
            others = [q for q in members if q != self.me and (senders is None or q in senders)]
            io_mark = time.process_time()
            payloads = self.updates.fetch(k, others) if others else {}
            self.io_cpu += time.process_time() - io_mark
            self.requests += bool(others)
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
            outcome = self._act_on(directive, k) if directive is not None else None
            if outcome:
                return outcome
        if advance:
            # The step is done: the cursor moves on by the members that trained it.
            self.cursor += len(self.members)
            self.step += 1
            if self._next_members is not None:
                self.members, self._next_members = self._next_members, None
        return None

    def _maybe_evaluate(self, k: int) -> None:
        """Every ``eval_interval`` steps the lowest-id worker scores its replica on the held-out
        split; on validation it keeps the best replica so far (the model early stopping writes)."""
        every = self._eval_every
        split = held_out_split(self.manifest)
        if not every or (k + 1) % every or self.me != self.members[0] or not getattr(self.manifest, split).parts:
            return
        started, cpu = time.perf_counter(), time.process_time()
        if self._test_parts is None:
            self._test_parts = PartCache(self.data, self.manifest, self.model, split=split,
                                         max_bytes=self.spec.aws.part_cache_bytes())
        metrics = self.model.evaluate(self._test_parts.get(i) for i in range(len(self._test_parts.infos)))
        epoch = (self.cursor + len(self.members)) / self.sequence.num_parts
        self._test_result = {"step": k, "split": split, "epoch": round(epoch, 4), "metrics": metrics}
        if split == "val":
            self._keep_if_best(k, epoch, metrics[self.model.loss_name])
        self._test_result["seconds"] = time.perf_counter() - started
        self._cpu_mark += time.process_time() - cpu  # scoring is not training: kept out of cpu_seconds

    def _keep_if_best(self, k: int, epoch: float, value: float) -> None:
        if self._best is None:  # the best so far of the job, whichever worker scored it
            try:
                self._best = json.loads(self.checkpoints.get(BEST_META_KEY))["value"]
            except KeyError:
                self._best = math.inf
        if value < self._best * (1 - self.spec.stop.min_delta):
            self._best = value
            self.checkpoints.put(BEST_KEY, encode_batch(self.model.replica_arrays()))
            self.checkpoints.put(
                BEST_META_KEY,
                json.dumps(
                    {"step": k, "epoch": round(epoch, 4), "value": value, "metric": self.model.loss_name}
                ).encode(),
            )

    def _act_on(self, directive: Directive, k: int) -> str | None:
        """Membership changes and stop, taken at the barrier after step k is applied."""
        if directive.stop:
            return self._end("stopped", self._write_checkpoint("stopped"))
        evicted = directive.evict
        if self.me in evicted or self.me in directive.donors:
            self.updates.put_blob(replica_blob(self.me, k), encode_batch(self.model.replica_arrays()))
        if self.me in evicted:
            return self._end("evicted")
        for q in evicted:
            # MLLess §4.2: fold the leaver's replica in, so its unsent updates are not lost.
            self.model.average_in(decode_batch(self._wait_blob(replica_blob(q, k))))
        if directive.members is not None:
            self._next_members = sorted(directive.members)
        return None
