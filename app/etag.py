"""ETags on JSON GET responses, so the dashboard's polling costs a 304 when nothing changed.

Browsers revalidate a `Cache-Control: no-cache` response with If-None-Match on their own,
so the pages poll with plain fetch() and still get 304s. Streams (log follow) and
non-JSON responses pass through untouched.
"""

from __future__ import annotations

import hashlib

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ETagMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or not scope["path"].startswith("/api/")
        ):
            await self.app(scope, receive, send)
            return
        wanted = Headers(scope=scope).get("if-none-match")
        start: Message | None = None
        body: list[bytes] = []

        async def buffered(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = Headers(raw=message["headers"])
                if message["status"] != 200 or not headers.get("content-type", "").startswith(
                    "application/json"
                ):
                    start = None
                    await send(message)
                    return
                start = message
                return
            if start is None:  # not ours to tag: passed through as it comes
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            content = b"".join(body)
            etag = '"' + hashlib.blake2b(content, digest_size=16).hexdigest() + '"'
            headers = MutableHeaders(raw=start["headers"])
            headers["etag"] = etag
            headers["cache-control"] = "private, no-cache"
            if wanted == etag:
                del headers["content-length"]
                await send({**start, "status": 304, "headers": headers.raw})
                await send({"type": "http.response.body", "body": b""})
                return
            await send({**start, "headers": headers.raw})
            await send({"type": "http.response.body", "body": content})

        await self.app(scope, receive, buffered)
