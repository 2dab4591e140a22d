"""The API app the tests talk to: create_app's, with its routes kept between tests.

FastAPI builds a router's routes (a pydantic adapter per parameter and response) at the
router's first request in each app: 300-400 ms per test on a loaded machine, which most API
tests paid again. The routes depend only on what create_app reads from the settings to
build them (the body limit, the trusted proxies); everything a request reads (settings,
database, broker, caches) is new per test (attach_services).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from app.config import Settings
from app.main import attach_services, create_app

_APPS: dict[tuple[int, tuple[str, ...]], FastAPI] = {}


def fresh_app(settings: Settings, **services: Any) -> FastAPI:
    """create_app(settings, **services), reusing the routes of an earlier call's app."""
    shape = (settings.max_body_bytes, tuple(settings.trusted_proxy_list))
    app = _APPS.get(shape)
    if app is None:
        app = _APPS[shape] = create_app(settings, **services)
    else:
        attach_services(app, settings, **services)
    return app
