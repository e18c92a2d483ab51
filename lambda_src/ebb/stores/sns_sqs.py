"""The signal channel over SNS and SQS (FSD-Inference §III-A, "FSD-Inf-Queue").

One control topic carries the supervisor's directives; every worker slot has its own
SQS queue, subscribed to the topic with raw message delivery and the filter policy
``{"worker": ["<w>", "all"]}`` (``ebb.ports.deployment.worker_filter_policy``), so SNS does the fan-out and a
worker never reads, parses or discards a message meant for another. A directive goes
out as ONE publish whose ``worker`` attribute is a ``String.Array`` of its trainers
(a policy value matches an array when any element equals it): it reaches exactly
their queues, whatever their number. Workers send their reports straight to the
supervisor's queue.

Unlike Redis, nothing here can open the barrier by itself: the supervisor's channel
object counts each step's reports as ``next_reports`` reads them and publishes the
step's staged directive when the last one is read (``release`` publishes at once, →
True, when they all were read already). The directive gets ``senders`` and
``last_sent_at`` exactly as the Redis scripts add them.

What SQS does not promise, the channel makes good:
- at-least-once delivery: a report is applied once per (kind, worker, step), a
  directive once per step, whatever SQS delivers twice;
- shared queues: every message carries its job and round as attributes; a consumer
  drops (deletes) those of another job or an earlier round, and leaves a later
  round's to that round's consumer. One job at a time may use a deployment's queues.
- the 256 KB limit: a message whose body and attributes exceed it travels by pointer,
  its body written to the scratch object store (``scratch/<job>/r<round>/…``).
- ordering: a worker is handed the lowest step it has received first.

Waits are SQS long polls of whole seconds, at most 20. ``counters`` counts requests and
the 64 KB chunks SNS and SQS bill, so the cost meter can use what was really sent.
"""

from __future__ import annotations

import json
import math
import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from ebb.ports.deployment import (
    CONTROL_TOPIC_ENV,
    FILTER_ATTRIBUTE,
    MAX_WORKERS_ENV,
    SUPERVISOR_QUEUE_ENV,
    WORKER_QUEUE_PREFIX_ENV,
    worker_queue_name,
)
from ebb.ports.messages import Directive, EndReport, MessageError, StepReport, decode_directive, decode_report, encode
from ebb.ports.objects import ObjectStore

from . import aws_clients

# SNS and SQS take at most 256 KiB per message, body and attributes together (names,
# types and values all count), and the same for all the messages of one batch request.
MAX_MESSAGE_BYTES = 262_144
BILLED_CHUNK_BYTES = 65_536  # each 64 KB of a request's payload is billed as one request
MAX_BATCH = 10
MAX_WAIT_S = 20  # SQS's longest long poll
SQS_READ_TIMEOUT_S = MAX_WAIT_S + 10.0  # a receive answers within its wait; past this, the endpoint is silent
LATER_ROUND_RETRY_S = 2  # a later round's message is left for its own consumer, visible again after this


@dataclass
class ChannelCounters:
    """What this channel object sent and received, in the units SNS, SQS and S3 bill."""

    sns_requests: int = 0  # Publish and PublishBatch calls
    sns_chunks: int = 0  # billed: 64 KB chunks of each request's payload (at least one)
    sns_delivered_bytes: int = 0  # SNS -> SQS bytes: payload x queues it reaches (the paper's Z)
    sqs_requests: int = 0  # SendMessage, ReceiveMessage, DeleteMessageBatch, ChangeMessageVisibilityBatch
    sqs_chunks: int = 0  # billed: 64 KB chunks of each request's payload (an empty receive is one)
    messages_sent: int = 0
    messages_received: int = 0
    duplicates: int = 0  # delivered again by SQS, dropped
    stale: int = 0  # another job's or an earlier round's, dropped
    scratch_puts: int = 0  # payloads sent by pointer
    scratch_gets: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _chunks(nbytes: int) -> int:
    return max(1, math.ceil(nbytes / BILLED_CHUNK_BYTES))


def _string(value: str) -> dict:
    return {"DataType": "String", "StringValue": value}


def _message_bytes(body: str, attributes: Mapping[str, dict]) -> int:
    size = len(body.encode())
    for name, attr in attributes.items():
        size += len(name.encode()) + len(attr["DataType"].encode()) + len(attr["StringValue"].encode())
    return size


@dataclass
class _Outgoing:
    body: str
    attributes: dict
    size: int
    targets: int = 1


@dataclass
class _Step:
    """What the supervisor has read of one step: who announced it, who sent something."""

    reported: set
    senders: set
    last_sent_at: float = 0.0
    members: int | None = None  # as the announcements say
    staged: tuple[list[int], Directive] | None = None


class SnsSqsSignalChannel:
    """Reports and directives of one round of one job over SNS and SQS.

    ``worker_queue_prefix`` + ``f"{w:03d}"`` is worker ``w``'s queue URL. ``scratch`` holds
    payloads over the 256 KB limit. The same object may serve the supervisor and
    in-process worker threads at once.
    """

    def __init__(
        self,
        job: str,
        round_: int,
        *,
        topic_arn: str,
        supervisor_queue_url: str,
        worker_queue_prefix: str,
        scratch: ObjectStore,
        sns=None,
        sqs=None,
        max_workers: int | None = None,
    ):
        region = _region_of(topic_arn)
        self.job, self.round = job, round_
        self.topic_arn, self.supervisor_queue_url = topic_arn, supervisor_queue_url
        self.worker_queue_prefix, self.max_workers = worker_queue_prefix, max_workers
        self.scratch = scratch
        self.sns = sns or aws_clients.client("sns", region=region)
        # A long poll holds the socket silent for up to MAX_WAIT_S by design.
        self.sqs = sqs or aws_clients.client("sqs", region=region, read_timeout_s=SQS_READ_TIMEOUT_S)
        self.counters = ChannelCounters()
        self.later_round_retry_s = LATER_ROUND_RETRY_S
        self._lock = threading.Lock()
        # supervisor side
        self._steps: dict[int, _Step] = {}
        self._published: set[int] = set()
        self._reports_seen: set[tuple[str, int, int]] = set()
        # worker side: directives received but not yet handed out, and the steps seen
        self._inbox: dict[int, dict[int, Directive]] = {}
        self._directives_seen: dict[int, set[int]] = {}

    @classmethod
    def from_env(
        cls,
        job: str,
        round_: int,
        scratch: ObjectStore,
        *,
        environ: Mapping[str, str] | None = None,
        sns=None,
        sqs=None,
    ) -> SnsSqsSignalChannel:
        """The channel the stack wired up (docs/AWS.md: ``EBB_CONTROL_TOPIC_ARN``,
        ``EBB_SUPERVISOR_QUEUE_URL``, ``EBB_WORKER_QUEUE_URL_PREFIX``, ``EBB_MAX_WORKERS``)."""
        env = os.environ if environ is None else environ

        def need(name: str) -> str:
            value = env.get(name, "").strip()
            if not value:
                raise ValueError(
                    f"{name} is not set: the SNS/SQS signal channel needs it (see docs/AWS.md, 'Environment variables')"
                )
            return value

        max_workers = env.get(MAX_WORKERS_ENV, "").strip()
        if max_workers and not max_workers.isdigit():
            raise ValueError(f"{MAX_WORKERS_ENV} must be a whole number, not {max_workers!r}")
        return cls(
            job,
            round_,
            topic_arn=need(CONTROL_TOPIC_ENV),
            supervisor_queue_url=need(SUPERVISOR_QUEUE_ENV),
            worker_queue_prefix=need(WORKER_QUEUE_PREFIX_ENV),
            scratch=scratch,
            sns=sns,
            sqs=sqs,
            max_workers=int(max_workers) if max_workers else None,
        )

    def __repr__(self) -> str:
        return f"SnsSqsSignalChannel(job={self.job!r}, round={self.round}, topic={self.topic_arn!r})"

    # -- workers -> supervisor --------------------------------------------------------
    def report(self, message: StepReport | EndReport) -> None:
        out = self._outgoing(encode(message), message.kind, message.step, _string(str(message.worker)))
        self.sqs.send_message(
            QueueUrl=self.supervisor_queue_url, MessageBody=out.body, MessageAttributes=out.attributes
        )
        self._count(sqs_requests=1, sqs_chunks=_chunks(out.size), messages_sent=1)

    def next_reports(self, timeout: float) -> list[StepReport | EndReport]:
        """Reports waiting on the supervisor queue (long poll up to ``timeout``, whole
        seconds); publishes the directives whose steps they complete."""
        got: list[StepReport | EndReport] = []
        wait = _wait_seconds(timeout)
        for _ in range(MAX_BATCH):  # drain up to 100 messages: full receives mean more are waiting
            messages = self._receive(self.supervisor_queue_url, wait)
            got += self._take(self.supervisor_queue_url, messages, self._accept_report)
            if len(messages) < MAX_BATCH:
                break
            wait = 0
        due = []
        with self._lock:
            for r in got:
                if isinstance(r, StepReport):
                    due += self._announced(r)
        self._publish(due)
        return got

    def _accept_report(self, kind: str, worker: int, step: int) -> bool:
        key = (kind, worker, step)
        with self._lock:
            if key in self._reports_seen:
                return False
            self._reports_seen.add(key)
            return True

    def _announced(self, r: StepReport) -> list[tuple[int, list[int], Directive]]:
        state = self._steps.setdefault(r.step, _Step(set(), set()))
        state.reported.add(r.worker)
        if r.sent_bytes:
            state.senders.add(r.worker)
        state.last_sent_at = max(state.last_sent_at, r.sent_at)
        state.members = len(r.members)
        if state.staged is None:
            return []
        # The staged directive names who trains the step (after a lost worker, fewer than
        # announced it): it goes out once all of those have announced.
        workers, directive = state.staged
        among = set(workers) & set(r.members)
        if len(among) != len(workers):
            raise RuntimeError(
                f"barrier: the directive of step {r.step} names {len(workers)} workers, "
                f"{len(among)} of them among the step's trainers"
            )
        if not set(workers) <= state.reported:
            return []
        return [self._due(r.step, workers, directive)]

    # -- supervisor -> workers --------------------------------------------------------
    def release(self, step: int, workers: list[int], directive: Directive) -> bool:
        workers = sorted(workers)
        self._check_workers(workers)
        with self._lock:
            if step in self._published:
                raise RuntimeError(f"step {step}'s directive was released already")
            state = self._steps.setdefault(step, _Step(set(), set()))
            if not set(workers) <= state.reported:
                state.staged = (workers, directive)
                return False
            due = [self._due(step, workers, directive)]
        self._publish(due)
        return True

    def _due(self, step: int, workers: list[int], directive: Directive) -> tuple[int, list[int], Directive]:
        """Take a complete step out of the barrier (under the lock): its directive as delivered."""
        state = self._steps.pop(step)
        self._published.add(step)
        full = directive.model_copy(update={"senders": sorted(state.senders), "last_sent_at": state.last_sent_at})
        return step, workers, full

    def _publish(self, due: list[tuple[int, list[int], Directive]]) -> None:
        """One message per directive, its ``worker`` attribute the trainers; several go
        in PublishBatch requests of up to 10 messages and 256 KB."""
        outgoing = []
        for step, workers, directive in due:
            to = {"DataType": "String.Array", "StringValue": json.dumps([str(w) for w in workers])}
            out = self._outgoing(encode(directive), "directive", step, to)
            out.targets = len(workers)
            outgoing.append(out)
        for batch in _batches(outgoing):
            size = sum(o.size for o in batch)
            if len(batch) == 1:
                self.sns.publish(TopicArn=self.topic_arn, Message=batch[0].body, MessageAttributes=batch[0].attributes)
            else:
                entries = [
                    {"Id": f"m{i}", "Message": o.body, "MessageAttributes": o.attributes} for i, o in enumerate(batch)
                ]
                failed = self.sns.publish_batch(TopicArn=self.topic_arn, PublishBatchRequestEntries=entries)["Failed"]
                if failed:
                    raise RuntimeError(
                        "SNS refused directives: "
                        + "; ".join(
                            f"{entries[int(f['Id'][1:])]['MessageAttributes']['step']['StringValue']}: "
                            f"{f.get('Code')} {f.get('Message', '')}"
                            for f in failed
                        )
                    )
            self._count(
                sns_requests=1,
                sns_chunks=_chunks(size),
                messages_sent=len(batch),
                sns_delivered_bytes=sum(o.size * o.targets for o in batch),
            )

    def next_directive(self, worker: int, timeout: float) -> Directive | None:
        """The lowest step's directive ``worker`` has received, long polling its queue up to
        ``timeout`` (whole seconds; 0: a short poll) when it holds none."""
        self._check_workers([worker])
        with self._lock:
            inbox = self._inbox.setdefault(worker, {})
            seen = self._directives_seen.setdefault(worker, set())
        if not inbox:
            url = worker_queue_name(self.worker_queue_prefix, worker)
            messages = self._receive(url, _wait_seconds(timeout))

            def accept(_kind: str, _sender: int | None, step: int) -> bool:
                if step in seen:
                    return False
                seen.add(step)
                return True

            for d in self._take(url, messages, accept, directive=True):
                inbox[d.step] = d
        return inbox.pop(min(inbox)) if inbox else None

    def _check_workers(self, workers: list[int]) -> None:
        if self.max_workers is not None and workers and (workers[-1] >= self.max_workers or workers[0] < 0):
            bad = [w for w in workers if not 0 <= w < self.max_workers]
            raise ValueError(
                f"worker {bad[0]} has no queue: the stack made {self.max_workers} (EBB_MAX_WORKERS); run fewer workers"
            )

    # -- the wire -----------------------------------------------------------------------
    def _outgoing(self, body: str, kind: str, step: int, worker_attr: dict) -> _Outgoing:
        attributes = {
            "job": _string(self.job),
            "round": _string(str(self.round)),
            "kind": _string(kind),
            "step": _string(str(step)),
            FILTER_ATTRIBUTE: worker_attr,
        }
        size = _message_bytes(body, attributes)
        if size > MAX_MESSAGE_BYTES:
            key = f"scratch/{self.job}/r{self.round}/{kind}-{step}-{uuid.uuid4().hex}"
            self.scratch.put(key, body.encode())
            self._count(scratch_puts=1)
            attributes["pointer"] = _string(key)
            body = key
            size = _message_bytes(body, attributes)
        return _Outgoing(body, attributes, size)

    def _receive(self, url: str, wait: int) -> list[dict]:
        messages = self.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=MAX_BATCH, WaitTimeSeconds=wait, MessageAttributeNames=["All"]
        ).get("Messages", [])
        size = sum(_message_bytes(m["Body"], m.get("MessageAttributes", {})) for m in messages)
        self._count(sqs_requests=1, sqs_chunks=_chunks(size), messages_received=len(messages))
        return messages

    def _take(self, url: str, messages: list[dict], accept, directive: bool = False) -> list:
        """Decode the messages that are this job's, this round's and new (``accept(kind,
        worker, step)`` says whether it is new); delete every one read but a later round's."""
        out, done, later = [], [], []
        try:
            for m in messages:
                attrs = m.get("MessageAttributes", {})
                try:
                    job, round_, kind, step, sender = _header(m, attrs, directive)
                except MessageError:
                    done.append(m)  # deleted, or it would fail every consumer of this queue after us
                    raise
                if job != self.job or round_ < self.round:
                    self._count(stale=1)
                    done.append(m)
                    continue
                if round_ > self.round:
                    later.append(m)
                    continue
                done.append(m)
                if not accept(kind, sender, step):
                    self._count(duplicates=1)
                    continue
                body = m["Body"]
                if "pointer" in attrs:
                    body = self._fetch_pointer(attrs["pointer"]["StringValue"], kind, step, spend=not directive)
                out.append(decode_directive(body) if directive else decode_report(body))
        finally:
            self._settle(url, done, later)
        return out

    def _fetch_pointer(self, key: str, kind: str, step: int, spend: bool) -> bytes:
        try:
            body = self.scratch.get(key)
        except KeyError:
            raise MessageError(
                f"the {kind} of step {step} was sent by pointer to {key!r}, which the scratch store does not hold"
            ) from None
        self._count(scratch_gets=1)
        if spend:  # a report has one reader; a directive's copy is read by every trainer (expired by lifecycle)
            self.scratch.delete(key)
        return body

    def _settle(self, url: str, done: list[dict], later: list[dict]) -> None:
        for i in range(0, len(done), MAX_BATCH):
            chunk = done[i : i + MAX_BATCH]
            # A failed delete only means SQS delivers the message again: a duplicate, dropped then.
            self.sqs.delete_message_batch(
                QueueUrl=url, Entries=[{"Id": str(j), "ReceiptHandle": m["ReceiptHandle"]} for j, m in enumerate(chunk)]
            )
            self._count(sqs_requests=1, sqs_chunks=1)
        for i in range(0, len(later), MAX_BATCH):
            chunk = later[i : i + MAX_BATCH]
            self.sqs.change_message_visibility_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(j), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": self.later_round_retry_s}
                    for j, m in enumerate(chunk)
                ],
            )
            self._count(sqs_requests=1, sqs_chunks=1)

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, n in deltas.items():
                setattr(self.counters, name, getattr(self.counters, name) + n)


def _header(m: dict, attrs: dict, directive: bool) -> tuple[str, int, str, int, int | None]:
    """(job, round, kind, step, sending worker) from a message's attributes, or an error naming it."""
    what = "directive" if directive else "report"
    try:
        job = attrs["job"]["StringValue"]
        round_ = int(attrs["round"]["StringValue"])
        kind = attrs["kind"]["StringValue"]
        step = int(attrs["step"]["StringValue"])
        sender = None if directive else int(attrs[FILTER_ATTRIBUTE]["StringValue"])
    except (KeyError, ValueError, TypeError) as exc:
        raise MessageError(
            f"malformed {what} {_clip(m.get('Body', ''))}: its attributes lack job, round, kind, "
            f"step or worker ({type(exc).__name__}: {exc})"
        ) from None
    if (kind == "directive") != directive:
        raise MessageError(
            f"malformed {what} {_clip(m.get('Body', ''))}: a {kind!r} on the "
            f"{'worker' if directive else 'supervisor'} queue"
        )
    return job, round_, kind, step, sender


def _clip(text: str, n: int = 160) -> str:
    return repr(text if len(text) <= n else text[:n] + "…")


def _batches(outgoing: list[_Outgoing]) -> list[list[_Outgoing]]:
    batches: list[list[_Outgoing]] = []
    size = 0
    for o in outgoing:
        if not batches or len(batches[-1]) == MAX_BATCH or size + o.size > MAX_MESSAGE_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(o)
        size += o.size
    return batches


def _wait_seconds(timeout: float) -> int:
    """SQS long polls in whole seconds up to 20: a positive timeout waits at least 1 s."""
    return 0 if timeout <= 0 else min(MAX_WAIT_S, max(1, int(timeout)))


def _region_of(topic_arn: str) -> str | None:
    parts = topic_arn.split(":")
    if len(parts) < 6 or parts[0] != "arn" or parts[2] != "sns":
        raise ValueError(f"not an SNS topic ARN: {topic_arn!r} (expected arn:aws:sns:<region>:<account>:<name>)")
    return parts[3] or None
