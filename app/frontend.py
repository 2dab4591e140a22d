"""Serves the dashboard (plain HTML, CSS and ES modules in frontend/) at `/`."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

FRONTEND_DIR = Path(__file__).resolve().parent.parent / "frontend"


def mount_frontend(app: FastAPI) -> None:
    if (FRONTEND_DIR / "index.html").exists():
        # Mounted last so /api, /docs and /healthz keep precedence.
        app.mount("/", StaticFiles(directory=FRONTEND_DIR, html=True), name="dashboard")
