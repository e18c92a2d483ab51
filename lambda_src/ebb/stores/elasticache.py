"""The Redis update store and signal channel on ElastiCache: TLS, the AUTH token from
Secrets Manager, and cluster mode (node-based cluster-mode or serverless caches).

``open_cache(job)`` reads the stack's variables (docs/AWS.md: ``EBB_REDIS_URLS``,
``EBB_REDIS_CLUSTER``, ``EBB_REDIS_SECRET_ARN``) and returns the job's update store and a
channel factory for a round.

The token is read once, at start, and lives in one ``AuthToken`` object: redis-py asks
it for credentials on each new connection and prints it as ``<REDACTED>``; its own repr
names the secret, never the value. No URL may carry credentials, and the token never
travels in clear text: AUTH over plain ``redis://`` is refused except on loopback.

Cluster mode: a cluster refuses a script or a multi-key command whose keys span hash
slots. The channel's keys share one tag per job (``ebb:{<job>}:…``) and its scripts get
every key in KEYS, so it runs as it is. Update keys get one tag per job and worker
(``ebb:{<job>#w<w>}:u:<step>``): a step's updates spread over the shards as they do over
the standalone servers (sharded by worker, MLLess §6.5), and a fetch is a pipeline of
GETs, which redis-py's cluster client sends to every shard before reading any reply —
one round trip, like the standalone store's MGET per shard. One tag per job would keep
MGET but put every update of the job on one shard: its bandwidth would cap the fleet.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from typing import NamedTuple
from urllib.parse import urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster

from ebb.ports.deployment import REDIS_CLUSTER_ENV, REDIS_SECRET_ENV, REDIS_URLS_ENV
from ebb.stores.redis_store import (
    UPDATE_TTL_S,
    RedisSignalChannel,
    RedisUpdateStore,
    connect,
    connection_options,
    job_prefix,
)


class AuthToken(redis.CredentialProvider):
    """The Redis AUTH token (and user, for RBAC) from a Secrets Manager secret whose
    ``SecretString`` is the token, or JSON with a ``password`` (and ``username``) field."""

    # Slots keep the token out of the instance __dict__, where a debug dump of an object's
    # attributes would find it.
    __slots__ = ("secret_arn", "_username", "_token")

    def __init__(self, secret_arn: str, secretsmanager=None):
        from .aws_clients import client as aws_client

        self.secret_arn = secret_arn
        client = secretsmanager or aws_client("secretsmanager", region=_region_of(secret_arn))
        with _no_response_bodies_logged():
            value = client.get_secret_value(SecretId=secret_arn).get("SecretString")
        self._username, self._token = _parse_secret(value, secret_arn)

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        return (self._username, self._token) if self._username else (self._token,)

    def __repr__(self) -> str:
        return f"AuthToken(secret={self.secret_arn!r})"

    def __reduce__(self):
        raise TypeError("an AuthToken is not pickled: read the secret where it is needed")


def _parse_secret(value: str | None, secret_arn: str) -> tuple[str | None, str]:
    # Errors name the secret and what is wrong with it, never any of its content.
    if not value:
        raise ValueError(f"secret {secret_arn} has no SecretString (the Redis AUTH token must be stored as text)")
    try:
        doc = json.loads(value)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return None, value
    password = doc.get("password")
    if not isinstance(password, str) or not password:
        raise ValueError(
            f"secret {secret_arn} is JSON without a 'password' field: store the Redis AUTH token "
            'as the whole SecretString or as {"password": …}'
        )
    username = doc.get("username")
    return (username if isinstance(username, str) and username else None), password


class _DropResponseBodies(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Response body")


@contextmanager
def _no_response_bodies_logged():
    """botocore logs every response body at DEBUG: not the one that holds the token."""
    log = logging.getLogger("botocore.parsers")
    dropper = _DropResponseBodies()
    log.addFilter(dropper)
    try:
        yield
    finally:
        log.removeFilter(dropper)


class CacheConfig(NamedTuple):
    urls: list[str]
    cluster: bool
    secret_arn: str | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CacheConfig:
        env = os.environ if environ is None else environ
        urls = [u.strip() for u in env.get(REDIS_URLS_ENV, "").split(",") if u.strip()]
        if not urls:
            raise ValueError(
                f"{REDIS_URLS_ENV} is not set: the cache's rediss://host:port endpoints, comma-separated "
                "(see docs/AWS.md, 'Environment variables')"
            )
        cluster = env.get(REDIS_CLUSTER_ENV, "0").strip()
        if cluster not in ("0", "1"):
            raise ValueError(f"{REDIS_CLUSTER_ENV} must be 0 or 1, not {cluster!r}")
        return cls(urls, cluster == "1", env.get(REDIS_SECRET_ENV, "").strip() or None)


class Cache(NamedTuple):
    """A job's stores on the cache: its update store, and ``channel(round)``."""

    updates: RedisUpdateStore | RedisClusterUpdateStore
    channel: Callable[[int], RedisSignalChannel]


def open_cache(
    job: str, *, environ: Mapping[str, str] | None = None, secretsmanager=None, ssl_ca_certs: str | None = None
) -> Cache:
    """The update store and channel factory of ``job`` on the cache the stack names.

    ``ssl_ca_certs``: a CA bundle to verify the servers with (default: the system's trust
    store, which ElastiCache's certificates chain to)."""
    config = CacheConfig.from_env(environ)
    for url in config.urls:
        _check_url(url, authenticated=config.secret_arn is not None)
    credentials = AuthToken(config.secret_arn, secretsmanager) if config.secret_arn else None
    tls = {"ssl_ca_certs": ssl_ca_certs} if ssl_ca_certs else {}
    if config.cluster:
        client = cluster_client(config.urls, credentials=credentials, **tls)
        return Cache(RedisClusterUpdateStore(client, job), lambda round_: RedisSignalChannel(client, job, round_))
    auth = {"credential_provider": credentials} if credentials else {}

    def client(url: str) -> redis.Redis:
        return connect(url, **((auth | tls) if url.startswith("rediss://") else auth))

    def channel(round_: int) -> RedisSignalChannel:
        return RedisSignalChannel(client(config.urls[0]), job, round_)

    return Cache(RedisUpdateStore([client(u) for u in config.urls], job), channel)


def cluster_client(
    urls: list[str], *, credentials: redis.CredentialProvider | None = None, ssl_ca_certs: str | None = None
) -> RedisCluster:
    """One client for a cluster-mode or serverless cache, ``urls`` its startup nodes."""
    parts = [urlsplit(u) for u in urls]
    tls = parts[0].scheme == "rediss"
    if any((p.scheme == "rediss") != tls for p in parts):
        raise ValueError("EBB_REDIS_URLS mixes redis:// and rediss://: a cluster is all TLS or none")
    options = connection_options()
    # The cluster client keeps its own retries (they cover MOVED and a cluster that is down).
    del options["retry"]
    if credentials is not None:
        options["credential_provider"] = credentials
    if tls:
        options["ssl"] = True
        if ssl_ca_certs:
            options["ssl_ca_certs"] = ssl_ca_certs
    return RedisCluster(startup_nodes=[ClusterNode(p.hostname, p.port or 6379) for p in parts], **options)


def _check_url(url: str, *, authenticated: bool) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ValueError(f"EBB_REDIS_URLS: expected redis[s]://host:port, got a {parts.scheme or 'schemeless'} URL")
    if parts.username or parts.password:
        raise ValueError(
            f"EBB_REDIS_URLS: the URL of {parts.hostname} holds credentials; the AUTH token comes "
            "from EBB_REDIS_SECRET_ARN only"
        )
    if authenticated and parts.scheme == "redis" and not _loopback(parts.hostname):
        raise ValueError(
            f"EBB_REDIS_URLS: redis://{parts.hostname} would send the AUTH token in clear text; use rediss:// (TLS)"
        )


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _region_of(arn: str) -> str | None:
    parts = arn.split(":")
    return parts[3] if len(parts) > 3 and parts[0] == "arn" and parts[3] else None


class RedisClusterUpdateStore:
    """The update store on a cluster: update keys tagged per job and worker, so a step's
    updates spread over the shards; fetched with a pipeline of GETs (no cross-slot MGET)."""

    def __init__(self, client: RedisCluster, job: str):
        self.client = client
        self.job = job
        self.prefix = job_prefix(job)
        self._worker_prefix = f"ebb:{{{job}#w"

    def _key(self, step: int, worker: int) -> str:
        return f"{self._worker_prefix}{worker}}}:u:{step}"

    def publish(self, step: int, worker: int, payload: bytes) -> None:
        self.client.set(self._key(step, worker), payload, ex=UPDATE_TTL_S)

    def fetch(self, step: int, workers: Iterable[int]) -> dict[int, bytes]:
        workers = list(workers)
        pipe = self.client.pipeline(transaction=False)
        for w in workers:
            pipe.get(self._key(step, w))
        return {w: v for w, v in zip(workers, pipe.execute()) if v is not None}

    def discard(self, steps: Iterable[int], workers: Iterable[int]) -> None:
        workers = list(workers)
        pipe = self.client.pipeline(transaction=False)
        for step in steps:
            for w in workers:
                pipe.unlink(self._key(step, w))
        pipe.execute()

    def put_blob(self, name: str, payload: bytes) -> None:
        self.client.set(self.prefix + "blob:" + name, payload, ex=UPDATE_TTL_S)

    def get_blob(self, name: str) -> bytes | None:
        return self.client.get(self.prefix + "blob:" + name)

    def heartbeat(self, worker: int, at: float) -> None:
        self.client.set(f"{self.prefix}hb:{worker}", repr(at), ex=UPDATE_TTL_S)

    def heartbeats(self, workers: Iterable[int]) -> dict[int, float]:
        workers = list(workers)  # one hash tag (the job's): one slot, so one MGET
        values = self.client.mget([f"{self.prefix}hb:{w}" for w in workers]) if workers else []
        return {w: float(v) for w, v in zip(workers, values) if v is not None}

    def clear(self) -> None:
        """Delete every key of this job, on every shard."""
        ours = (self.prefix.encode(), self._worker_prefix.encode())
        keys = [
            k for k in self.client.scan_iter(match=f"ebb:{{{_glob_escape(self.job)}*", count=1000) if k.startswith(ours)
        ]
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.unlink(k)
        pipe.execute()


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
