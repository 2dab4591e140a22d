"""A real HTTP server on loopback standing in for a webhook (chat, CI, a script)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """A real HTTP server on loopback that records what it is sent, and answers `status`."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.hosts: list[str] = []  # each request's Host header
        self.status = 200
        self.location: str | None = None  # sent with the answer (a redirect)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                receiver.bodies.append(json.loads(self.rfile.read(length)))
                receiver.hosts.append(self.headers["Host"])
                self.send_response(receiver.status)
                if receiver.location is not None:
                    self.send_header("Location", receiver.location)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
