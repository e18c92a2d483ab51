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


# A step's directive is delivered by whichever of these runs second: the report that
# completes the step, or the supervisor's release of the directive. Both are atomic
# scripts, so exactly one delivers; when the supervisor keeps up (it decides step k+1's
# directive while step k+1 runs), the last announcement opens the barrier inside Redis
# and the supervisor is off the step's critical path. The directive gets the step's
# senders (whose updates to read) and the last announcement's time on the way out.
_DELIVER = """
local function deliver(prefix, t, directive)
  local d = cjson.decode(directive)
  local to = d['to']
  d['to'] = nil
  local senders = {}
  for _, w in ipairs(redis.call('LRANGE', prefix .. 'senders:' .. t, 0, -1)) do senders[#senders + 1] = tonumber(w) end
  table.sort(senders)
  d['senders'] = senders
  d['last_sent_at'] = tonumber(redis.call('GET', prefix .. 'lastsent:' .. t))
  local body = cjson.encode(d)
  for _, w in ipairs(to) do redis.call('RPUSH', prefix .. 'dir:' .. w, body) end
  redis.call('DEL', prefix .. 'senders:' .. t, prefix .. 'lastsent:' .. t, prefix .. 'staged:' .. t,
             prefix .. 'count:' .. t)
end
"""

# KEYS: reports, wake; ARGV: body, prefix, step, expect (0: not a step report), worker, sent (0/1), sent_at
_REPORT = _DELIVER + """
redis.call('RPUSH', KEYS[1], ARGV[1])
if ARGV[4] == '0' then
  redis.call('RPUSH', KEYS[2], '1')
  return 0
end
local prefix, t = ARGV[2], ARGV[3]
if ARGV[6] == '1' then redis.call('RPUSH', prefix .. 'senders:' .. t, ARGV[5]) end
local last = redis.call('GET', prefix .. 'lastsent:' .. t)
if not last or tonumber(last) < tonumber(ARGV[7]) then redis.call('SET', prefix .. 'lastsent:' .. t, ARGV[7]) end
local n = redis.call('INCR', prefix .. 'count:' .. t)
for _, k in ipairs({'senders:', 'lastsent:', 'count:'}) do redis.call('EXPIRE', prefix .. k .. t, 3600) end
if n >= tonumber(ARGV[4]) then
  local staged = redis.call('GET', prefix .. 'staged:' .. t)
  if staged then deliver(prefix, t, staged) end
  redis.call('RPUSH', KEYS[2], '1')  -- the supervisor closes the step either way
end
return 0
"""

# ARGV: directive (with 'to'), prefix, step, number of workers; returns 1 if it was delivered at once
_RELEASE = _DELIVER + """
local prefix, t = ARGV[2], ARGV[3]
local n = tonumber(redis.call('GET', prefix .. 'count:' .. t) or '0')
if n >= tonumber(ARGV[4]) then
  deliver(prefix, t, ARGV[1])
  return 1
end
redis.call('SET', prefix .. 'staged:' .. t, ARGV[1], 'EX', 3600)
return 0
"""

_LIST_FIELDS = ("senders", "evict", "members", "donors")


class RedisSignalChannel:
    def __init__(self, url: str, job: str):
        self.r = connect(url)
        self.prefix = f"ebb:{job}:"
        self.reports_key = self.prefix + "reports"
        self.wake_key = self.prefix + "wake"
        self._report = self.r.register_script(_REPORT)
        self._release = self.r.register_script(_RELEASE)

    def report(self, message: dict) -> None:
        """Queue a report. A step report carries ``expect`` (the workers of its step)."""
        body = json.dumps(message, separators=(",", ":"))
        expect = message.get("expect") if message.get("type") == "step" else None
        self._report(keys=[self.reports_key, self.wake_key],
                     args=[body, self.prefix, message.get("t", 0), expect or 0, message.get("w", -1),
                           1 if message.get("sent_bytes") else 0, repr(float(message.get("sent_at", 0.0)))])

    def release(self, step: int, workers: list[int], directive: dict) -> bool:
        body = json.dumps({**directive, "to": list(workers)}, separators=(",", ":"))
        return bool(self._release(keys=[], args=[body, self.prefix, step, len(workers)]))

    def next_reports(self, timeout: float) -> list[dict]:
        if self.r.blpop([self.wake_key], timeout=timeout) is None:
            return []
        pipe = self.r.pipeline(transaction=True)  # atomic: no report slips between read and delete
        pipe.lrange(self.reports_key, 0, -1)
        pipe.delete(self.reports_key, self.wake_key)
        reports, _ = pipe.execute()
        return [json.loads(m) for m in reports]

    def next_directive(self, worker: int, timeout: float) -> dict | None:
        key = f"{self.prefix}dir:{worker}"
        if timeout <= 0:
            raw = self.r.lpop(key)
        else:
            got = self.r.blpop([key], timeout=timeout)
            raw = got[1] if got is not None else None
        if raw is None:
            return None
        directive = json.loads(raw)
        for name in _LIST_FIELDS:  # Lua's cjson writes an empty list as {}
            if directive.get(name) == {}:
                directive[name] = []
        return directive
