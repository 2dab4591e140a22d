"""ASGI entry point for running several uvicorn workers (production / docker-compose):

    uvicorn app.asgi:app --workers 4

Settings come from GPUSCHED_* variables; run `gpusched migrate` once beforehand.
"""

from app.config import load_settings
from app.main import create_app

app = create_app(load_settings())
