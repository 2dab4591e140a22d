"""Headers that make the browser hold the dashboard to what it is: its own scripts and
styles only, never framed, never sniffed.

The dashboard's scripts are files of its own (ES modules under frontend/js), with no inline
script, event handler attribute or style attribute (styles are set through the DOM, which
a CSP allows), so a policy of `'self'` breaks nothing and makes any injected markup inert.
The API's own documentation pages (/docs, /redoc) load Swagger UI and ReDoc from the app
itself (DOCS_ASSETS) but start them with an inline script and style themselves inline:
their policy allows inline code and still nothing from another origin.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DASHBOARD_CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
# Swagger UI and ReDoc: same-origin only, with the inline script and styles they need
# (ReDoc's search runs in a worker made from a blob: URL; both draw icons from data: URLs).
DOCS_CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "worker-src 'self' blob:",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
DOCS_PATHS = ("/docs", "/redoc")
# Where Swagger UI's and ReDoc's own files are served (fastapi-offline's copies).
DOCS_ASSETS = "/docs/assets"

_COMMON = {
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",  # frame-ancestors for browsers that predate it
}


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        docs = scope["path"].startswith(DOCS_PATHS)
        policy = DOCS_CSP if docs else DASHBOARD_CSP

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in _COMMON.items():
                    headers.setdefault(name, value)
                headers.setdefault("content-security-policy", policy)
            await send(message)

        await self.app(scope, receive, with_headers)
