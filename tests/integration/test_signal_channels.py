"""The signal channel contract, held to the in-memory, Redis and SNS/SQS channels alike;
then what only SNS/SQS must make good (filtering, pointers, duplicates, shared queues)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import boto3
import numpy as np
import pytest
import redis

from ebb.local.runner import run_local
from ebb.ports.deployment import worker_filter_policy
from ebb.ports.messages import Directive, MessageError, Scoring, decode_directive, decode_report
from ebb.spec import load_spec
from ebb.stores.local import FolderObjectStore
from ebb.stores.memory import MemorySignalChannel
from ebb.stores.redis_store import RedisSignalChannel
from ebb.stores.sns_sqs import MAX_MESSAGE_BYTES, SnsSqsSignalChannel
from tests.helpers.channel_contract import announce, barrier_contract, drain, make_report, read_until

WORKER_SLOTS = 8


@pytest.fixture
def stack(aws_mock, tmp_path):
    """The messaging resources as the stack makes them: a control topic, a supervisor
    queue, and one queue per worker slot subscribed raw with its filter policy."""
    sns, sqs = boto3.client("sns"), boto3.client("sqs")
    topic = sns.create_topic(Name="ebb-control")["TopicArn"]
    supervisor = sqs.create_queue(QueueName="ebb-supervisor")["QueueUrl"]
    urls = []
    for w in range(WORKER_SLOTS):
        url = sqs.create_queue(QueueName=f"ebb-worker-{w:03d}")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(
            TopicArn=topic,
            Protocol="sqs",
            Endpoint=arn,
            Attributes={"RawMessageDelivery": "true", "FilterPolicy": json.dumps(worker_filter_policy(w))},
        )
        urls.append(url)
    scratch = FolderObjectStore(tmp_path / "scratch")

    def channel(job: str, round_: int = 0, **kw) -> SnsSqsSignalChannel:
        return SnsSqsSignalChannel(
            job,
            round_,
            topic_arn=topic,
            supervisor_queue_url=supervisor,
            worker_queue_prefix=urls[0][:-3],
            scratch=scratch,
            **{"sns": sns, "sqs": sqs, "max_workers": WORKER_SLOTS, **kw},
        )

    return SimpleNamespace(
        sns=sns, sqs=sqs, topic=topic, supervisor=supervisor, worker_urls=urls, scratch=scratch, channel=channel
    )


@pytest.fixture(params=["memory", "redis", "sns_sqs"])
def make_channel(request, redis_url):
    """``make_channel(job, round)``: a channel of the parametrised kind."""
    if request.param == "memory":
        return lambda job, round_=0: MemorySignalChannel()
    if request.param == "redis":
        return lambda job, round_=0: RedisSignalChannel(redis_url, f"{job}-{time.monotonic_ns()}", round_)
    return request.getfixturevalue("stack").channel


# -- the contract, for every channel ---------------------------------------------------
def test_the_last_announcement_or_a_late_release_opens_the_barrier(make_channel):
    barrier_contract(make_channel("barrier"))


def test_a_malformed_message_is_an_error_that_names_it(make_channel, request):
    with pytest.raises(MessageError, match=r"malformed report .*members: Field required"):
        decode_report('{"kind": "step", "worker": 1, "step": 2}')
    with pytest.raises(MessageError, match="malformed directive .*not JSON"):
        decode_directive(b"\x80garbage")
    with pytest.raises(MessageError, match="malformed report .*kind"):
        decode_report('{"w": 1, "t": 2}')  # the old one-letter keys are not a message any more
    ch = make_channel("bad")
    bad = '{"kind": "end", "worker": "x"}'
    if isinstance(ch, MemorySignalChannel):
        ch._reports.put(bad)
    elif isinstance(ch, RedisSignalChannel):
        ch.r.rpush(ch.reports_key, bad)
        ch.r.rpush(ch.wake_key, "1")
    else:
        attrs = {"job": "bad", "round": "0", "kind": "end", "step": "0", "worker": "1"}
        ch.sqs.send_message(
            QueueUrl=ch.supervisor_queue_url,
            MessageBody=bad,
            MessageAttributes={k: {"DataType": "String", "StringValue": v} for k, v in attrs.items()},
        )
    with pytest.raises(MessageError, match="malformed report .*worker"):
        ch.next_reports(1.0)
    if isinstance(ch, SnsSqsSignalChannel):  # a foreign message, without the channel's attributes
        ch.sqs.send_message(QueueUrl=ch.supervisor_queue_url, MessageBody="hello")
        with pytest.raises(MessageError, match="malformed report 'hello': its attributes lack job"):
            ch.next_reports(1.0)
        assert ch.next_reports(1.0) == []  # and it is gone: it fails one read, not every job after


def test_a_directive_staged_for_fewer_workers_opens_the_barrier_for_them(make_channel, request):
    """After a worker is lost mid-step, the step's directive names the survivors: it is
    delivered once they have announced, to them only; a directive naming a worker outside
    the step's trainers is refused."""
    ch = make_channel("lost")
    seen: list = []
    announce(ch, 0, 0, True, time.time())
    seen += ch.next_reports(0.2)
    assert ch.release(0, [0, 2], Directive(step=0, members=[0, 2])) is False
    announce(ch, 2, 0, True, time.time())
    read_until(ch, seen, step=0, n=2)
    assert ch.next_directive(0, 1.0).members == [0, 2] and ch.next_directive(2, 1.0).members == [0, 2]
    assert ch.next_directive(1, 0) is None  # the lost worker hears nothing
    if isinstance(ch, MemorySignalChannel):
        return
    refused = redis.ResponseError if isinstance(ch, RedisSignalChannel) else RuntimeError
    ch.release(1, [0, 5], Directive(step=1))
    announce(ch, 0, 1, True, time.time(), members=(0, 1))
    with pytest.raises(refused, match="names 2 workers, 1 of them among the step's trainers"):
        announce(ch, 1, 1, True, time.time(), members=(0, 1))
        drain(ch)  # SNS/SQS: the supervisor finds out as it reads the step's reports


# -- SNS/SQS only -------------------------------------------------------------------------
def _complete(ch, step: int, workers: list[int], directive: Directive) -> None:
    """Announce ``step`` from ``workers``, read the reports and release the directive."""
    for w in workers:
        announce(ch, w, step, True, time.time(), members=workers)
    seen: list = []
    read_until(ch, seen, step, len(workers))
    ch.release(step, workers, directive)


def _queued(stack, w: int) -> int:
    attrs = stack.sqs.get_queue_attributes(
        QueueUrl=stack.worker_urls[w],
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def test_a_directive_reaches_exactly_its_workers_in_one_publish(stack):
    ch = stack.channel("filter")
    _complete(ch, 4, [3], Directive(step=4))  # for worker 3 only
    assert [_queued(stack, w) for w in range(WORKER_SLOTS)] == [0, 0, 0, 1, 0, 0, 0, 0]
    assert ch.next_directive(4, 1.0) is None  # worker 4 waits in vain
    assert ch.next_directive(3, 1.0).step == 4
    before = ch.counters.sns_requests
    _complete(ch, 5, [1, 3, 6], Directive(step=5))  # one String.Array publish for three trainers
    assert ch.counters.sns_requests == before + 1
    assert [_queued(stack, w) for w in range(WORKER_SLOTS)] == [0, 1, 0, 1, 0, 0, 1, 0]
    assert [ch.next_directive(w, 1.0).step for w in (1, 3, 6)] == [5, 5, 5]
    # A broadcast (worker = "all", as an operator would send a stop) reaches every queue.
    stop = Directive(step=6, stop=True).model_dump_json(exclude_none=True)
    stack.sns.publish(
        TopicArn=stack.topic,
        Message=stop,
        MessageAttributes={
            k: {"DataType": "String", "StringValue": v}
            for k, v in {"job": "filter", "round": "0", "kind": "directive", "step": "6", "worker": "all"}.items()
        },
    )
    assert [ch.next_directive(w, 1.0).stop for w in range(WORKER_SLOTS)] == [True] * WORKER_SLOTS
    assert [_queued(stack, w) for w in range(WORKER_SLOTS)] == [0] * WORKER_SLOTS  # all read and deleted


def test_a_payload_over_256_kb_travels_by_pointer_and_arrives_intact(stack):
    ch = stack.channel("big")
    # A report with a large scoring, then a directive naming a fleet of 70,000 workers.
    curve = np.random.default_rng(0).random(20_000).tolist()
    metrics = {f"m{i}": v for i, v in enumerate(curve)}
    big_report = make_report(
        0, 0, True, time.time(), members=(0, 1), scoring=Scoring(step=0, split="val", epoch=0.0, metrics=metrics)
    )
    ch.report(big_report)
    announce(ch, 1, 0, True, time.time(), members=(0, 1))
    assert ch.counters.scratch_puts == 1
    seen: list = []
    read_until(ch, seen, 0, 2)
    assert next(r for r in seen if r.worker == 0) == big_report  # bit for bit, floats included
    assert stack.scratch.list("scratch/big/") == []  # the supervisor spent the report's copy
    fleet = Directive(step=0, members=list(range(70_000)))
    assert len(fleet.model_dump_json()) > MAX_MESSAGE_BYTES
    assert ch.release(0, [0, 1], fleet) is True
    assert ch.counters.scratch_puts == 2 and len(stack.scratch.list("scratch/big/r0/")) == 1
    for w in (0, 1):
        d = ch.next_directive(w, 1.0)
        assert d.members == fleet.members and d.senders == [0, 1]
    assert ch.counters.scratch_gets == 3
    # Just under the limit goes inline: one SQS message, no scratch object.
    pad = {f"p{i:05d}": 0.5 for i in range(15_000)}  # about 200 KB
    ch.report(
        make_report(
            0, 1, True, time.time(), members=(0, 1), scoring=Scoring(step=0, split="val", epoch=0.0, metrics=pad)
        )
    )
    assert ch.counters.scratch_puts == 2
    assert drain(ch)[0].scoring.metrics == pad


class _LosingDeletes:
    """An SQS client whose first batch delete is lost: the messages come back, as SQS
    redelivers whatever it was not told (in time) was processed."""

    def __init__(self, sqs):
        self.sqs, self.lost = sqs, 0

    def __getattr__(self, name):
        return getattr(self.sqs, name)

    def delete_message_batch(self, QueueUrl, Entries):  # noqa: N803 (boto3's names)
        if self.lost:
            return self.sqs.delete_message_batch(QueueUrl=QueueUrl, Entries=Entries)
        self.lost += 1
        return self.sqs.change_message_visibility_batch(
            QueueUrl=QueueUrl, Entries=[{**e, "VisibilityTimeout": 0} for e in Entries]
        )


def test_a_message_delivered_twice_is_applied_once(stack):
    ch = stack.channel("twice", sqs=_LosingDeletes(stack.sqs))
    assert ch.release(0, [0, 1], Directive(step=0)) is False
    announce(ch, 0, 0, True, time.time(), members=(0, 1))
    first = ch.next_reports(1.0)
    again = ch.next_reports(1.0)  # the same message, delivered again
    assert [r.worker for r in first] == [0] and again == [] and ch.counters.duplicates == 1
    # Sent twice (a worker's retry): still one announcement, so the barrier stays shut.
    announce(ch, 0, 0, True, time.time(), members=(0, 1))
    assert ch.next_reports(1.0) == [] and ch.counters.duplicates == 2
    assert ch.next_directive(0, 0) is None
    announce(ch, 1, 0, False, time.time(), members=(0, 1))
    assert [r.worker for r in ch.next_reports(1.0)] == [1]
    d = ch.next_directive(0, 1.0)
    assert d.step == 0 and d.senders == [0]
    # A directive delivered twice reaches the worker once.
    raw = stack.sqs.receive_message(QueueUrl=stack.worker_urls[1], MessageAttributeNames=["All"], WaitTimeSeconds=1)[
        "Messages"
    ][0]
    for _ in range(2):
        stack.sqs.send_message(
            QueueUrl=stack.worker_urls[1], MessageBody=raw["Body"], MessageAttributes=raw["MessageAttributes"]
        )
    assert ch.next_directive(1, 1.0).step == 0
    assert ch.next_directive(1, 1.0) is None and ch.counters.duplicates == 3


def test_messages_of_another_job_or_an_earlier_round_are_dropped(stack):
    mine = stack.channel("job-a", 1)
    mine.later_round_retry_s = 0
    stack.channel("job-b", 1).report(make_report(0, 5, True, time.time()))
    stack.channel("job-a", 0).report(make_report(1, 5, True, time.time()))  # a crashed round's leftover
    stack.channel("job-a", 2).report(make_report(2, 9, True, time.time()))  # the next round's: not ours to drop
    mine.report(make_report(0, 7, True, time.time()))
    assert [(r.worker, r.step) for r in drain(mine)] == [(0, 7)]
    assert mine.counters.stale == 2
    assert [(r.worker, r.step) for r in drain(stack.channel("job-a", 2))] == [(2, 9)]
    # The same on a worker's queue.
    other = stack.channel("job-b", 1)
    _complete(other, 3, [0], Directive(step=3))
    assert mine.next_directive(0, 1.0) is None and mine.counters.stale == 3
    _complete(mine, 3, [0], Directive(step=3))
    assert mine.next_directive(0, 1.0).step == 3


def test_the_channel_reads_the_stacks_environment_and_counts_what_it_sends(stack):
    env = {
        "EBB_CONTROL_TOPIC_ARN": stack.topic,
        "EBB_SUPERVISOR_QUEUE_URL": stack.supervisor,
        "EBB_WORKER_QUEUE_URL_PREFIX": stack.worker_urls[0][:-3],
        "EBB_MAX_WORKERS": "4",
    }
    ch = SnsSqsSignalChannel.from_env("env", 0, stack.scratch, environ=env)
    with pytest.raises(ValueError, match="EBB_SUPERVISOR_QUEUE_URL is not set"):
        SnsSqsSignalChannel.from_env("env", 0, stack.scratch, environ={**env, "EBB_SUPERVISOR_QUEUE_URL": ""})
    with pytest.raises(ValueError, match="worker 5 has no queue: the stack made 4"):
        ch.next_directive(5, 0)
    _complete(ch, 0, [0, 1], Directive(step=0))
    assert [ch.next_directive(w, 1.0).step for w in (0, 1)] == [0, 0]
    c = ch.counters
    assert c.sns_requests == 1 and c.sns_chunks == 1 and c.messages_sent == 3 and c.messages_received == 4
    # 2 sends, the supervisor's receives (each followed by a delete), each worker's receive + delete
    assert c.sqs_requests >= 2 + 2 + 4 and (c.sqs_requests - 2 - 4) % 2 == 0
    assert c.sqs_chunks == c.sqs_requests  # every payload under 64 KB: one billed request each
    assert c.sns_delivered_bytes > 2 * len('{"step":0}') and c.sns_delivered_bytes % 2 == 0  # one copy per queue
    assert repr(ch) == f"SnsSqsSignalChannel(job='env', round=0, topic={stack.topic!r})"


def _pmf(data_dir, out, **fields):
    base = {
        "model": "pmf",
        "data": data_dir,
        "out": str(out),
        "scaling.policy": "none",
        "seed": 3,
        "hyper.rank": 6,
        "stop.max_epochs": 3,
        "workers": 3,
        "round_steps": 6,
    }
    base.update(fields)
    return load_spec(overrides=base)


@pytest.mark.parametrize("sync", ["bsp", "ssp"])
def test_a_job_trains_over_sns_sqs_round_by_round(small_ratings, stack, tmp_path, sync):
    """The engine, unchanged, over SNS/SQS (a channel per round, as on Lambda): the same
    model as over the in-memory channel (BSP bit for bit)."""
    data_dir, _ = small_ratings
    fields = {"sync.mode": sync} | ({"sync.slack": 2} if sync == "ssp" else {})
    channels = []

    def per_round(round_: int) -> SnsSqsSignalChannel:
        channels.append(stack.channel("e2e", round_))
        return channels[-1]

    report, model = run_local(_pmf(data_dir, tmp_path / "sqs", **fields), in_process=True, signals=per_round)
    assert report["status"] == "max_epochs" and report["rounds"] == len(channels) >= 2
    assert sum(c.counters.duplicates + c.counters.stale for c in channels) == 0
    if sync == "bsp":
        memory, memory_model = run_local(_pmf(data_dir, tmp_path / "mem", **fields), in_process=True)
        assert [h["loss"] for h in report["history"]] == [h["loss"] for h in memory["history"]]
        assert all(np.array_equal(model[k], memory_model[k]) for k in memory_model)
    else:
        assert report["history"][-1]["loss"] < report["history"][0]["loss"]


# -- what only Redis must make good -------------------------------------------------------
def test_a_directive_taken_by_a_read_given_up_after_a_pause_is_not_lost(redis_url):
    """A worker woken from a pause past its socket timeout gives its blocking read up and
    reads again on a new connection, while the server (paused too) still holds the old read
    and serves it first. The directive it hands that read waits in taken:<w> and the next
    read returns it; a directive read normally is removed from there by the next read."""
    channel = RedisSignalChannel(redis_url, f"paused-{time.monotonic_ns()}")
    r = channel.r
    dir_key, taken = f"{channel.prefix}dir:0", f"{channel.prefix}taken:0"
    abandoned = redis.ConnectionPool.from_url(redis_url).make_connection()
    abandoned.connect()
    abandoned.send_command("BLMOVE", dir_key, taken, "LEFT", "RIGHT", 0)  # never read again
    deadline = time.monotonic() + 5
    while b"cmd=blmove" not in r.execute_command("CLIENT", "LIST", "TYPE", "normal"):
        assert time.monotonic() < deadline, "the abandoned read never blocked"
        time.sleep(0.01)
    r.rpush(dir_key, json.dumps({"step": 3}))  # the abandoned read is served first
    got = channel.next_directive(0, timeout=0.2)
    assert got is not None and got.step == 3
    assert r.llen(taken) == 0
    r.rpush(dir_key, json.dumps({"step": 4}), json.dumps({"step": 5}))
    assert channel.next_directive(0, timeout=0.2).step == 4
    assert r.llen(taken) == 1  # until the next read
    assert channel.next_directive(0, timeout=0).step == 5
    assert r.lrange(taken, 0, -1) == [json.dumps({"step": 5}).encode()]
    assert channel.next_directive(0, timeout=0.1) is None
    assert r.llen(taken) == 0
    abandoned.disconnect()
