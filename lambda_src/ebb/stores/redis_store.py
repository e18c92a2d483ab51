"""Redis implementations of the update store and the signal channel.

Updates are written as raw bytes (the binary ``RowUpdate`` encoding), one key per
(step, worker), with a TTL so nothing outlives a crashed job, and deleted by the
supervisor once every worker has applied them. Keys are sharded over several Redis
servers by worker id (MLLess §6.5). Control messages are small JSON documents on lists:
``reports`` (workers → supervisor) and ``dir:<worker>`` (supervisor → a worker).
"""

from __future__ import annotations

import json
from typing import Iterable

import redis

UPDATE_TTL_S = 3600


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_keepalive=True, health_check_interval=30)


class RedisUpdateStore:
    def __init__(self, urls: list[str], job: str):
        if not urls:
            raise ValueError("at least one Redis URL is needed")
        self.shards = [connect(u) for u in urls]
        self.prefix = f"ebb:{job}:"

    def _key(self, step: int, worker: int) -> str:
        return f"{self.prefix}u:{step}:{worker}"

    def _shard(self, worker: int) -> redis.Redis:
        return self.shards[worker % len(self.shards)]

    def publish(self, step: int, worker: int, payload: bytes) -> None:
        self._shard(worker).set(self._key(step, worker), payload, ex=UPDATE_TTL_S)

    def fetch(self, step: int, workers: Iterable[int]) -> dict[int, bytes]:
        by_shard: dict[int, list[int]] = {}
        for w in workers:
            by_shard.setdefault(w % len(self.shards), []).append(w)
        out: dict[int, bytes] = {}
        for shard, ws in by_shard.items():
            values = self.shards[shard].mget([self._key(step, w) for w in ws])
            out.update({w: v for w, v in zip(ws, values) if v is not None})
        return out

    def discard(self, steps: Iterable[int], workers: Iterable[int]) -> None:
        workers = list(workers)
        pipes = [s.pipeline(transaction=False) for s in self.shards]
        for step in steps:
            for w in workers:
                pipes[w % len(self.shards)].unlink(self._key(step, w))
        for p in pipes:
            p.execute()

    def put_blob(self, name: str, payload: bytes) -> None:
        self.shards[0].set(self.prefix + "blob:" + name, payload, ex=UPDATE_TTL_S)

    def get_blob(self, name: str) -> bytes | None:
        return self.shards[0].get(self.prefix + "blob:" + name)

    def clear(self) -> None:
        """Delete every key of this job (end of job); a server already gone holds nothing."""
        for s in self.shards:
            try:
                self._clear_shard(s)
            except redis.ConnectionError:
                pass

    def _clear_shard(self, shard: redis.Redis) -> None:
        keys = list(shard.scan_iter(match=self.prefix + "*", count=1000))
        for i in range(0, len(keys), 500):
            shard.unlink(*keys[i : i + 500])


# Queue a report and count it; only the report that completes its step (or one that
# must be seen at once) wakes the supervisor. One round trip per report, one wake per
# step — the supervisor does not pay a round trip for each of P workers (MLLess §3).
_REPORT = """
redis.call('RPUSH', KEYS[1], ARGV[1])
local wake = ARGV[2] == '1'
if not wake then
  local n = redis.call('INCR', KEYS[3])
  redis.call('EXPIRE', KEYS[3], 3600)
  wake = n >= tonumber(ARGV[3])
end
if wake then redis.call('RPUSH', KEYS[2], '1') end
return 0
"""


class RedisSignalChannel:
    def __init__(self, url: str, job: str):
        self.r = connect(url)
        self.prefix = f"ebb:{job}:"
        self.reports_key = self.prefix + "reports"
        self.wake_key = self.prefix + "wake"
        self._report = self.r.register_script(_REPORT)

    def report(self, message: dict) -> None:
        """Queue a report. A step report carries ``expect`` (the workers of its step)."""
        body = json.dumps(message, separators=(",", ":"))
        expect = message.get("expect")
        count_key = f"{self.prefix}count:{message.get('t', 0)}"
        self._report(keys=[self.reports_key, self.wake_key, count_key],
                     args=[body, "0" if expect else "1", expect or 0])

    def next_reports(self, timeout: float) -> list[dict]:
        if self.r.blpop([self.wake_key], timeout=timeout) is None:
            return []
        pipe = self.r.pipeline(transaction=True)  # atomic: no report slips between read and delete
        pipe.lrange(self.reports_key, 0, -1)
        pipe.delete(self.reports_key, self.wake_key)
        reports, _ = pipe.execute()
        return [json.loads(m) for m in reports]

    def direct(self, workers: Iterable[int], message: dict) -> None:
        body = json.dumps(message, separators=(",", ":"))
        pipe = self.r.pipeline(transaction=False)
        for w in workers:
            pipe.rpush(f"{self.prefix}dir:{w}", body)
        pipe.execute()

    def next_directive(self, worker: int, timeout: float) -> dict | None:
        key = f"{self.prefix}dir:{worker}"
        if timeout <= 0:
            raw = self.r.lpop(key)
            return json.loads(raw) if raw is not None else None
        got = self.r.blpop([key], timeout=timeout)
        return json.loads(got[1]) if got is not None else None
