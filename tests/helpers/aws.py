"""AWS test helpers: a ``moto_server`` process on loopback, and what points a client at it.

In-process tests use ``moto.mock_aws``. Tests that run a real CLI (``ebb prepare``,
``ebb train``, ``ebb submit``...) as a subprocess need a real HTTP endpoint instead: the
session-scoped ``moto_server`` fixture (tests/conftest.py) starts one :class:`MotoServer`,
``moto_env`` gives a subprocess environment pointing at it, and :func:`server_client` a
boto3 client for the test's own set-up and checks. The server is shared by the whole
session: give each test its own bucket (:func:`unique_bucket`) rather than resetting it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from ebb.local.redis_server import free_port, stop_process

REGION = "us-east-1"
MOTO_SERVER = Path(__file__).with_name("moto_additions.py")
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


class MotoServer:
    """``with MotoServer() as srv: srv.url`` — a ``moto_server`` (all services, with what
    tests/moto_additions.py adds) on a free loopback port, started on enter and stopped (by
    pid) on exit. Its request log goes to a file, shown if it fails to start."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="ebb-moto-")
        self.log_path = Path(self._dir.name, "moto_server.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> MotoServer:
        with open(self.log_path, "wb") as log:
            # moto_server with what tests/moto_additions.py adds (Lambda's account settings, ...)
            self.proc = subprocess.Popen(
                [sys.executable, str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited at start:\n{self.log_path.read_text(errors='replace')}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"moto_server not ready on port {self.port} after {timeout} s")
            time.sleep(0.05)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)
        self._dir.cleanup()

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def aws_env(endpoint_url: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) for a subprocess that must talk only to
    ``endpoint_url``: every inherited ``AWS_*`` variable dropped (no real profile or key can
    leak in), fake credentials, a region, ``AWS_ENDPOINT_URL``, and no config files or
    instance metadata lookups."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("AWS_")}
    env.update(FAKE_CREDENTIALS)
    env.update(
        {
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": endpoint_url,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    return env


_session = None


def server_client(endpoint_url: str, service: str = "s3"):
    """A boto3 client for ``service`` on the moto server, with fake credentials (from one
    session per test process: a new session parses the service model again, ~0.1 s)."""
    global _session
    if _session is None:
        import boto3

        _session = boto3.session.Session()
    return _session.client(
        service,
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def unique_bucket(prefix: str = "ebb-test") -> str:
    """A bucket name no other test of the session uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
