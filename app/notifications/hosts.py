"""Which hosts the server may POST notifications to (GPUSCHED_NOTIFY_HOSTS): a job's
URL is checked when it is submitted or changed, and again when the message is sent."""

from __future__ import annotations

from urllib.parse import urlsplit


def host_allowed(url: str, allowed: frozenset[str]) -> bool:
    """Whether the server may POST to `url`: its host is listed, or "*" is."""
    host = (urlsplit(url).hostname or "").lower()
    return bool(host) and ("*" in allowed or host in allowed)


def check_url(url: str, allowed: frozenset[str]) -> str | None:
    """Why the server would not notify `url`, or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "expected an http:// or https:// URL"
    if not allowed:
        return "notifications are off on this server (an admin allows hosts with GPUSCHED_NOTIFY_HOSTS)"
    if not host_allowed(url, allowed):
        shown = ", ".join(sorted(allowed))
        return f"host {parts.hostname} is not allowed here (allowed: {shown})"
    return None
