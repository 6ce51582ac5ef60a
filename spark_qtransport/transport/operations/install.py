"""Installers: create queue tables with the dialect's idempotent DDL (used by jobs, tests and the CLI)."""

from __future__ import annotations

from ...connections import ConnectionURL
from ...dialects import dialect_for
from .. import session as db

__all__ = ["create_queues"]


def create_queues(url: ConnectionURL, *addresses: str, seq_bits: int = 64) -> list[str]:
    """Create each queue if missing; return their canonical addresses. Safe to run concurrently,
    with each other and with NServiceBus's installers (`session.install`)."""
    dialect = dialect_for(url)
    parsed = [dialect.parse_address(a) for a in addresses]
    conn = dialect.connect(url)
    try:
        cur = conn.cursor()
        for address in parsed:
            db.warn_about_name(dialect, address)
            db.install(dialect, cur, dialect.create_queue(address, seq_bits=seq_bits))
            conn.commit()
    finally:
        conn.close()
    return [dialect.format_address(a) for a in parsed]
