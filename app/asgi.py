"""ASGI entry point for running several uvicorn workers (production / docker-compose):

    uvicorn app.asgi:app --workers 4 --no-proxy-headers

Settings come from GPUSCHED_* variables; run `gpusched migrate` once beforehand.
--no-proxy-headers: without it uvicorn believes X-Forwarded-For from 127.0.0.1, and a
client there picks its own address per request; the app itself trusts the proxies
GPUSCHED_TRUSTED_PROXIES names.
"""

from app.config import load_settings
from app.main import create_app

app = create_app(load_settings())
