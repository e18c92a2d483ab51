"""A TCP server that accepts connections and never answers: the hostile endpoint of the
timeout tests (an S3 or Redis address behind a hung proxy or a stopped process)."""

from __future__ import annotations

import socket
import threading


class SilentServer:
    """``with SilentServer() as srv: srv.port`` — accepts, reads and never writes a byte;
    ``srv.connections`` counts the connections it took."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._held: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self._held.append(conn)  # held open, never answered

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed.set()
        self.sock.close()
        for conn in self._held:
            conn.close()
