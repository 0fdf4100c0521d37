"""A local IMDSv2 server (tests only): what an EC2 instance's metadata service answers."""

from __future__ import annotations

import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeImds:
    """A local IMDSv2 server: tokens required, 404 until a notice is set.

    Instance metadata exists only on an EC2 instance; this fake speaks the same protocol
    (``PUT /latest/api/token`` with a TTL header, ``GET`` with the token header, 401 on a
    missing/revoked token, 404 for absent paths) on 127.0.0.1.
    """

    def __init__(self) -> None:
        self.instance_id = "i-0123456789abcdef0"
        self.instance_action: str | None = None
        self.rebalance: str | None = None
        self.tokens: set[str] = set()
        self.token_puts = 0
        self.requests: list[tuple[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def _send(self, status: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                fake.requests.append(("PUT", self.path))
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                if self.path != "/latest/api/token" or not ttl or not 1 <= int(ttl) <= 21600:
                    self._send(400)
                    return
                token = uuid.uuid4().hex
                fake.tokens.add(token)
                fake.token_puts += 1
                self._send(200, token)

            def do_GET(self) -> None:
                fake.requests.append(("GET", self.path))
                if self.headers.get("X-aws-ec2-metadata-token") not in fake.tokens:
                    self._send(401)
                    return
                body = {
                    "/latest/meta-data/instance-id": fake.instance_id,
                    "/latest/meta-data/spot/instance-action": fake.instance_action,
                    "/latest/meta-data/events/recommendations/rebalance": fake.rebalance,
                }.get(self.path)
                if body is None:
                    self._send(404, "<html>404 - Not Found</html>")
                else:
                    self._send(200, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
