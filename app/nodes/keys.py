"""Each node's key, with which it and the scheduler sign every message between them.

A key is derived from the installation's secret: key = HMAC-SHA256(secret, "node:" +
name). The secret lives in the database, which every control-plane process (API
replicas, scheduler workers) already shares and trusts, so none needs a file of its
own, and a backup restores the keys with the data. The migration that made its table
created it (a database emptied since gets a new one at first use). An agent
holds only its own key (a 0600 file: `gpusched admin node-key NAME` prints it, `gpusched
up` writes it), so a node can speak only for itself.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.nodes.models import ClusterSecret


def node_key(secret: bytes, node: str) -> bytes:
    return hmac.new(secret, f"node:{node}".encode(), hashlib.sha256).digest()


def installation_secret(factory: sessionmaker[Session]) -> bytes:
    """The installation's secret (created and committed if the table was emptied)."""
    with factory() as session:
        found = session.scalar(select(ClusterSecret.secret_hex).where(ClusterSecret.id == 1))
        if found is None:
            session.add(ClusterSecret(id=1, secret_hex=secrets.token_hex(32)))
            try:
                session.commit()
            except IntegrityError:  # another process created it first: theirs holds
                session.rollback()
            found = session.scalar(select(ClusterSecret.secret_hex).where(ClusterSecret.id == 1))
        assert found is not None
        return bytes.fromhex(found)


class NodeKeys:
    """Every node's key for a control-plane process: the secret is read once, at the
    first message (`keys(node)`)."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._secret: bytes | None = None

    def __call__(self, node: str) -> bytes:
        if self._secret is None:
            with self._lock:
                if self._secret is None:
                    self._secret = installation_secret(self._factory)
        return node_key(self._secret, node)
