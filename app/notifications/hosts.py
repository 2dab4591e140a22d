"""Where the server may POST notifications (GPUSCHED_NOTIFY_HOSTS): a job's URL is checked
when it is submitted or changed, and again when each message is sent.

The scheduler POSTs from inside the cluster, so a URL must not make it reach inside
(OWASP's SSRF guidance): the host's name is resolved and every address it resolves to
must be public, not loopback, private, link-local (the cloud metadata service,
169.254.169.254), multicast, unspecified or reserved. The message is then sent to the
address checked, so a name that resolves to a public address for the check and to
127.0.0.1 a moment later (DNS rebinding) reaches nothing inside. A host the admin names
in the list is vouched for and may be inside ("chat.internal", "127.0.0.1"); "*" admits
any other host whose addresses are all public.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(Exception):
    """The server will not send to this URL now; the message says why, for the server's
    log (a user is told only that delivery failed: the reason could tell them what lies
    inside)."""


def resolve(host: str, port: int) -> list[IPAddress]:
    """The addresses `host` resolves to now (a literal address: itself). The one place
    names are resolved, so tests stub it instead of the network."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # An IPv6 link-local address carries its zone ("fe80::1%eth0"): the address is enough.
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


def is_public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    return address.is_global and not (address.is_multicast or address.is_reserved)


def host_allowed(url: str, allowed: frozenset[str]) -> bool:
    """Whether the list admits `url`'s host: it is listed, or "*" is (then only while its
    addresses are public: `delivery_address` checks)."""
    host = (urlsplit(url).hostname or "").lower()
    return bool(host) and ("*" in allowed or host in allowed)


def delivery_address(url: str, allowed: frozenset[str]) -> IPAddress:
    """The address to send `url`'s message to, resolved now: one the host resolves to, all
    of which must be public unless the admin named the host. Refused otherwise."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host_allowed(url, allowed):
        raise Refused(f"host {host} is not allowed (GPUSCHED_NOTIFY_HOSTS)")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError, ValueError) as exc:
        raise Refused(f"host {host} does not resolve: {exc}") from None
    if not addresses:
        raise Refused(f"host {host} does not resolve")
    if host not in allowed:
        inside = [str(a) for a in addresses if not is_public(a)]
        if inside:
            raise Refused(f"host {host} resolves to {', '.join(inside)}, not a public address")
    return addresses[0]


def check_url(url: str, allowed: frozenset[str]) -> str | None:
    """Why the server would not notify `url`, or None. A host only "*" admits must resolve,
    to public addresses only; one that does not resolve is refused in the same words as
    one that resolves inside: which names exist inside is not for users to learn."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "expected an http:// or https:// URL"
    try:
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return "the port must be a number from 0 to 65535"
    if not allowed:
        return "notifications are off on this server (an admin allows hosts with GPUSCHED_NOTIFY_HOSTS)"
    host = parts.hostname.lower()
    if host in allowed:
        return None  # named by the admin: resolved when a message is sent
    if "*" not in allowed:
        shown = ", ".join(sorted(allowed))
        return f"host {host} is not allowed here (allowed: {shown})"
    try:
        delivery_address(url, allowed)
    except Refused:
        return (
            f"host {host} does not resolve to public addresses only; a host inside the "
            "network needs an admin to name it in GPUSCHED_NOTIFY_HOSTS"
        )
    return None
