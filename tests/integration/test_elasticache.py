"""The update store and signal channel as they run on ElastiCache: TLS (a real
redis-server with a certificate made here), the AUTH token from Secrets Manager (moto),
and cluster mode (a real two-shard cluster) — and the token never shows."""

from __future__ import annotations

import json
import logging
import pickle
import secrets
import time
import traceback
from types import SimpleNamespace

import boto3
import pytest
import redis

from ebb.local.redis_server import free_port
from ebb.stores.elasticache import AuthToken, RedisClusterUpdateStore, open_cache
from ebb.stores.redis_store import BLOCK_CHUNK_S, RedisUpdateStore
from tests.helpers.channel_contract import barrier_contract
from tests.helpers.tls_redis import NoTlsError, TlsRedisServers


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    s = TlsRedisServers(tmp_path_factory.mktemp("tls-redis"), password=f"ebb-token-{secrets.token_hex(16)}")
    yield s
    s.stop()


def _start(servers: TlsRedisServers, cluster: bool = False) -> int:
    try:
        return servers.start(cluster=cluster)
    except NoTlsError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def standalone(servers):
    """Two TLS servers with the AUTH token, the update store sharded over both."""
    return [f"rediss://127.0.0.1:{_start(servers)}" for _ in range(2)]


@pytest.fixture(scope="module")
def cluster(servers):
    """A two-shard cluster (TLS on the client and bus ports, the AUTH token): slots 0-8191
    on the first node, the rest on the second."""
    ports = [_start(servers, cluster=True) for _ in range(2)]
    a, b = (servers.client(p) for p in ports)
    a.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 8191)
    b.execute_command("CLUSTER", "ADDSLOTSRANGE", 8192, 16383)
    a.execute_command("CLUSTER", "MEET", "127.0.0.1", ports[1])
    deadline = time.monotonic() + 15
    while not all(
        "cluster_state:ok" in c.execute_command("CLUSTER", "INFO").decode()
        and len(c.execute_command("CLUSTER", "SLOTS")) == 2
        for c in (a, b)
    ):
        assert time.monotonic() < deadline, "the test cluster did not form"
        time.sleep(0.05)
    return [f"rediss://127.0.0.1:{p}" for p in ports]


@pytest.fixture
def secretsmanager(aws_mock):
    client = boto3.client("secretsmanager")

    def secret(value: str) -> str:
        return client.create_secret(Name=f"ebb/redis-{secrets.token_hex(4)}", SecretString=value)["ARN"]

    return SimpleNamespace(client=client, secret=secret)


def _env(urls: list[str], arn: str | None, cluster: bool = False) -> dict[str, str]:
    env = {"EBB_REDIS_URLS": ",".join(urls), "EBB_REDIS_CLUSTER": "1" if cluster else "0"}
    return env | ({"EBB_REDIS_SECRET_ARN": arn} if arn else {})


def _texts(*things) -> str:
    """Everything that could show a value: reprs, object dicts, formatted exceptions."""
    out = []
    for t in things:
        if isinstance(t, BaseException):
            out.append("".join(traceback.format_exception(t)))
        else:
            out += [repr(t), repr(getattr(t, "__dict__", ""))]
    return "\n".join(out)


@pytest.mark.parametrize("mode", ["standalone", "cluster"])
def test_the_stores_run_over_tls_with_the_token_from_secrets_manager(
    mode, request, servers, secretsmanager, caplog, capfd
):
    urls = request.getfixturevalue(mode)
    # The token as the whole SecretString, or as JSON with a password field (stored by the
    # stack, not by us: the test's own CreateSecret call is made before the capture).
    value = servers.password if mode == "standalone" else json.dumps({"password": servers.password})
    arn = secretsmanager.secret(value)
    caplog.set_level(logging.DEBUG)  # every library's debug lines, botocore's included
    cache = open_cache(f"tls-{mode}", environ=_env(urls, arn, cluster=mode == "cluster"), ssl_ca_certs=servers.cert)
    store = cache.updates
    for w in range(6):
        store.publish(3, w, bytes([w]) * 100)
    assert store.fetch(3, range(8)) == {w: bytes([w]) * 100 for w in range(6)}
    store.put_blob("replica-0", b"\x00" * 1000)
    assert store.get_blob("replica-0") == b"\x00" * 1000
    store.discard([3], range(6))
    assert store.fetch(3, range(6)) == {}
    channel = cache.channel(0)
    barrier_contract(channel)
    if mode == "cluster":
        assert isinstance(store, RedisClusterUpdateStore)
        client = store.client
        nodes = {client.get_node_from_key(store._key(3, w)).name for w in range(6)}
        assert len(nodes) == 2, "one step's updates spread over both shards"
        clients = [n.redis_connection for n in client.get_nodes()]
    else:
        assert isinstance(store, RedisUpdateStore)
        clients = [*store.shards, channel.r]
    # Every blocking read is bounded below the socket timeout, TLS verified against our CA.
    for c in clients:
        kwargs = c.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] > BLOCK_CHUNK_S
        assert c.connection_pool.connection_class is redis.SSLConnection
        assert kwargs.get("ssl_cert_reqs", "required") == "required" and kwargs["ssl_ca_certs"] == servers.cert
    store.put_blob("x", b"1")
    store.clear()
    leftovers = [k for c in clients for k in c.scan_iter(match=f"ebb:{{tls-{mode}*")]
    assert leftovers == []
    out, err = capfd.readouterr()
    shown = _texts(cache, store, channel, *clients) + caplog.text + out + err
    assert servers.password not in shown
    assert "get_secret_value" in caplog.text.lower() or "GetSecretValue" in caplog.text  # botocore did log the call


def test_the_token_shows_in_no_log_line_exception_or_repr(servers, standalone, secretsmanager, caplog, capfd):
    token = f"ebb-token-{secrets.token_hex(16)}"  # not the servers' password: a failing AUTH
    arn = secretsmanager.secret(json.dumps({"password": token}))
    no_password_arn = secretsmanager.secret(json.dumps({"token": token}))
    caplog.set_level(logging.DEBUG)
    failures: list[BaseException] = []
    wrong = open_cache("wrong", environ=_env(standalone, arn), ssl_ca_certs=servers.cert)
    with pytest.raises(redis.AuthenticationError) as auth_failed:
        wrong.updates.publish(0, 0, b"x")
    failures.append(auth_failed.value)
    with pytest.raises(redis.ConnectionError) as unreachable:
        open_cache("gone", environ=_env([f"rediss://127.0.0.1:{free_port()}"], arn), ssl_ca_certs=servers.cert).channel(
            0
        ).next_reports(0.1)
    failures.append(unreachable.value)
    with pytest.raises(ValueError, match="clear text; use rediss://") as clear_text:
        open_cache("plain", environ=_env(["redis://10.0.0.5:6379"], arn))
    failures.append(clear_text.value)
    with pytest.raises(ValueError, match="holds credentials") as in_url:
        open_cache("url", environ=_env([f"rediss://:{token}@cache.example:6379"], arn))
    failures.append(in_url.value)
    with pytest.raises(ValueError, match="JSON without a 'password' field") as no_password:
        open_cache("json", environ=_env(standalone, no_password_arn))
    failures.append(no_password.value)
    credentials = AuthToken(arn, secretsmanager.client)
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(credentials)
    assert credentials.get_credentials() == (token,)
    out, err = capfd.readouterr()
    shown = _texts(*failures, wrong, wrong.updates, credentials) + caplog.text + out + err
    assert token not in shown
    # The capture is real: botocore logs a secret's value at DEBUG when nothing stops it.
    secretsmanager.client.get_secret_value(SecretId=arn)
    assert token in caplog.text


def test_the_local_path_is_untouched(redis_url):
    """Plain redis:// without a secret: the clients the local runner has always made."""
    cache = open_cache("local", environ=_env([redis_url], None))
    assert isinstance(cache.updates, RedisUpdateStore)
    kwargs = cache.updates.shards[0].connection_pool.connection_kwargs
    assert "credential_provider" not in kwargs and "ssl_ca_certs" not in kwargs
    barrier_contract(cache.channel(0))
    with pytest.raises(ValueError, match="EBB_REDIS_CLUSTER must be 0 or 1"):
        open_cache("bad", environ={"EBB_REDIS_URLS": redis_url, "EBB_REDIS_CLUSTER": "yes"})
    with pytest.raises(ValueError, match="EBB_REDIS_URLS is not set"):
        open_cache("bad", environ={})
