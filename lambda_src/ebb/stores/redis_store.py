"""Redis implementations of the update store and the signal channel.

Updates are written as raw bytes (the binary ``RowUpdate`` encoding), one key per
(step, worker), with a TTL so nothing outlives a crashed job, and deleted by the
supervisor once every worker has applied them. Keys are sharded over several Redis
servers by worker id (MLLess §6.5). Control messages (``ebb.ports.messages``) are JSON
documents on lists: ``reports`` (workers → supervisor) and ``dir:<worker>`` (supervisor →
a worker; read by moving into ``taken:<worker>``), under a per-round prefix so nothing of
an earlier (or crashed) round is read.

Every key of a job shares one hash tag, ``ebb:{<job>}:…``, and the scripts are given
every key they touch in KEYS, so the same code runs on a cluster-mode or serverless
cache, where a script's keys must live in one hash slot.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from ebb.ports.messages import Directive, EndReport, StepReport, decode_directive, decode_report, encode

UPDATE_TTL_S = 3600
# Longest single blocking read a channel makes; callers loop on it up to their own
# deadlines. The socket must outlast it: redis-py 8's default 5 s socket timeout would
# otherwise cut every longer wait short with a TimeoutError.
BLOCK_CHUNK_S = 5.0
SOCKET_MARGIN_S = 5.0  # past a blocking read's own timeout, how long a reply may take
SOCKET_CONNECT_TIMEOUT_S = 5.0
# A command that fails (a dropped connection, a server restarted, a timeout) is tried once
# more on a new connection, not 3 times as redis-py 8 does (129 s on a silent server). Once:
# a process stopped or suspended past its socket timeout wakes with that timeout fired before
# the server (paused too) could answer, and the second try finds the answer.
CONNECTION_RETRIES = 1
_BACKOFF_CAP_S = 0.5


def socket_timeout_s() -> float:
    return BLOCK_CHUNK_S + SOCKET_MARGIN_S


def silent_server_bound_s() -> float:
    """Longest one Redis command waits on a server that never answers (docs/RELIABILITY.md,
    "Bounds"): each of its tries connects (redis-py tries a socket connect as often again) and
    reads once; backoff between them. A server that accepts and stays silent costs the reads
    alone; one that takes no connection, the connects alone; this bound holds for either."""
    tries = 1 + CONNECTION_RETRIES
    return tries * (tries * SOCKET_CONNECT_TIMEOUT_S + socket_timeout_s()) + (tries * tries - 1) * _BACKOFF_CAP_S


def connection_options() -> dict:
    """The engine's socket settings (read at each call, so tests may lower the constants).
    No idle health check: its PING is retried inside the command's own retries (4 tries in
    all); a connection that died while idle fails its command, which is tried again anyway."""
    return {
        "socket_keepalive": True,
        "socket_timeout": socket_timeout_s(),
        "socket_connect_timeout": SOCKET_CONNECT_TIMEOUT_S,
        "retry": Retry(
            ExponentialWithJitterBackoff(base=0.05, cap=_BACKOFF_CAP_S),
            CONNECTION_RETRIES,
            supported_errors=(redis.ConnectionError, redis.TimeoutError),
        ),
    }


def connect(url: str, **options) -> redis.Redis:
    """A client for ``url`` with the engine's timeouts; ``options`` (TLS, credentials) add to them."""
    return redis.Redis.from_url(url, **(connection_options() | options))


def redact(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: what may be printed or logged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def job_prefix(job: str) -> str:
    """Every key of a job starts with this; ``{job}`` is the hash tag that keeps them in one slot."""
    return f"ebb:{{{job}}}:"


class RedisUpdateStore:
    """Updates sharded by worker over ``shards``: Redis URLs, or clients made elsewhere
    (``ebb.stores.elasticache`` adds TLS and the AUTH token)."""

    def __init__(self, shards: list[str | redis.Redis], job: str):
        if not shards:
            raise ValueError("at least one Redis URL is needed")
        self.shards = [connect(s) if isinstance(s, str) else s for s in shards]
        self.prefix = job_prefix(job)

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

    def heartbeat(self, worker: int, at: float) -> None:
        self.shards[0].set(f"{self.prefix}hb:{worker}", repr(at), ex=UPDATE_TTL_S)

    def heartbeats(self, workers: Iterable[int]) -> dict[int, float]:
        workers = list(workers)
        values = self.shards[0].mget([f"{self.prefix}hb:{w}" for w in workers]) if workers else []
        return {w: float(v) for w, v in zip(workers, values) if v is not None}

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
# KEYS of both scripts: senders, lastsent, count, staged, then dir:<w> of every trainer.
_DELIVER = """
local function deliver(directive, first_dir)
  local d = cjson.decode(directive)
  local trainers = {}
  for _, w in ipairs(d['trainers']) do trainers[tostring(w)] = true end
  local targets = {}
  for i = first_dir, #KEYS do
    local w = string.match(KEYS[i], 'dir:(%d+)$')
    if trainers[w] then targets[#targets + 1] = KEYS[i] end
  end
  if #targets ~= #d['trainers'] then
    return redis.error_reply('barrier: the directive of step ' .. d['step'] .. ' names ' .. #d['trainers'] ..
                             ' workers, ' .. #targets .. " of them among the step's trainers")
  end
  d['trainers'] = nil
  local senders = {}
  for _, w in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do senders[#senders + 1] = tonumber(w) end
  table.sort(senders)
  d['senders'] = senders
  d['last_sent_at'] = redis.call('GET', KEYS[2])  -- a string: cjson would round a number to 14 digits
  local body = cjson.encode(d)
  for _, key in ipairs(targets) do redis.call('RPUSH', key, body) end
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
  return 1
end
"""

# KEYS: senders, lastsent, count, staged, reports, wake, dir:<w>...; ARGV: the step report
_REPORT = (
    _DELIVER
    + """
local m = cjson.decode(ARGV[1])
redis.call('RPUSH', KEYS[5], ARGV[1])
if m['sent_bytes'] > 0 then redis.call('RPUSH', KEYS[1], m['worker']) end
local sent_at = string.format('%.6f', m['sent_at'])
local last = redis.call('GET', KEYS[2])
if not last or tonumber(last) < tonumber(sent_at) then redis.call('SET', KEYS[2], sent_at) end
local n = redis.call('INCR', KEYS[3])
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], 3600) end
-- A staged directive names who trains the step (after a lost worker, fewer than announced it).
local staged = redis.call('GET', KEYS[4])
local need = #m['members']
if staged then need = #cjson.decode(staged)['trainers'] end
if n >= need then
  if staged then
    local ok = deliver(staged, 7)
    if type(ok) == 'table' then return ok end
  end
  redis.call('RPUSH', KEYS[6], '1')  -- the supervisor closes the step either way
end
return 0
"""
)

# KEYS: senders, lastsent, count, staged, dir:<w>...; ARGV: directive (with 'trainers'), number of
# workers. Returns 1 if it was delivered at once (the step was complete already).
_RELEASE = (
    _DELIVER
    + """
local n = tonumber(redis.call('GET', KEYS[3]) or '0')
if n >= tonumber(ARGV[2]) then
  return deliver(ARGV[1], 5)
end
redis.call('SET', KEYS[4], ARGV[1], 'EX', 3600)
return 0
"""
)


class RedisSignalChannel:
    """Reports and directives of one round of one job over one Redis server (a URL, or a
    client: a cluster client works too, every script's keys being in one slot)."""

    def __init__(self, server: str | redis.Redis, job: str, round_: int = 0):
        self.r = connect(server) if isinstance(server, str) else server
        self.prefix = f"{job_prefix(job)}r{round_}:"
        self.reports_key = self.prefix + "reports"
        self.wake_key = self.prefix + "wake"
        self._report = self.r.register_script(_REPORT)
        self._release = self.r.register_script(_RELEASE)
        self._last_taken: dict[int, bytes] = {}  # per worker: the directive to remove from taken:<w>

    def _barrier_keys(self, step: int, workers: list[int]) -> list[str]:
        p = self.prefix
        return [
            f"{p}senders:{step}",
            f"{p}lastsent:{step}",
            f"{p}count:{step}",
            f"{p}staged:{step}",
            *(f"{p}dir:{w}" for w in sorted(workers)),
        ]

    def report(self, message: StepReport | EndReport) -> None:
        """Queue a report. A step report goes through the script that may open the
        barrier, given every key it writes (the dir keys of the step's trainers)."""
        body = encode(message)
        if isinstance(message, StepReport):
            keys = self._barrier_keys(message.step, message.members)
            self._report(keys=keys[:4] + [self.reports_key, self.wake_key] + keys[4:], args=[body])
        else:
            pipe = self.r.pipeline(transaction=True)
            pipe.rpush(self.reports_key, body)
            pipe.rpush(self.wake_key, "1")
            pipe.execute()

    def release(self, step: int, workers: list[int], directive: Directive) -> bool:
        body = json.dumps({**json.loads(encode(directive)), "trainers": sorted(workers)}, separators=(",", ":"))
        return bool(self._release(keys=self._barrier_keys(step, workers), args=[body, len(workers)]))

    def next_reports(self, timeout: float) -> list[StepReport | EndReport]:
        # The reports are read whether or not the wake token came: a token can be lost (a
        # client that woke from a pause past its socket timeout gave its BLPOP up while the
        # server, paused too, still held it and later served it), the reports cannot.
        self.r.blpop([self.wake_key], timeout=min(timeout, BLOCK_CHUNK_S))
        pipe = self.r.pipeline(transaction=True)  # atomic: no report slips between read and delete
        pipe.lrange(self.reports_key, 0, -1)
        pipe.delete(self.reports_key, self.wake_key)
        reports, _ = pipe.execute()
        return [decode_report(m) for m in reports]

    def next_directive(self, worker: int, timeout: float) -> Directive | None:
        # A directive is moved, not popped, into taken:<worker> and removed from there with
        # the next read: a blocking read given up by a client woken from a pause past its
        # socket timeout may still be served by the server (paused too), and what it took
        # then waits in taken:<worker>, not lost (docs/RELIABILITY.md, "Bounds").
        key, taken = f"{self.prefix}dir:{worker}", f"{self.prefix}taken:{worker}"
        pipe = self.r.pipeline(transaction=False)
        last = self._last_taken.pop(worker, None)
        if last is not None:
            pipe.lrem(taken, 1, last)
        if timeout <= 0:
            pipe.lmove(key, taken, "LEFT", "RIGHT")
        else:
            pipe.blmove(key, taken, min(timeout, BLOCK_CHUNK_S), "LEFT", "RIGHT")
        raw = pipe.execute()[-1]
        if raw is not None:
            self._last_taken[worker] = raw
        elif timeout > 0:
            raw = self.r.lpop(taken)  # taken by an abandoned read of ours, or nothing
        return None if raw is None else decode_directive(raw)
