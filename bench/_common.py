"""What both benchmarks share: their arguments, the database they run on, filling a queue."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator


def arguments(doc: str | None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    ap.add_argument("--per-trigger", type=int, default=50_000)
    ap.add_argument("--nsb-messages", type=int, default=20_000, help="messages for the one-row baseline")
    return ap


@contextlib.contextmanager
def database(args: argparse.Namespace) -> Iterator[str]:
    """$SQLQUEUE_URL, else an embedded PostgreSQL with fsync on (durable commits); prints which."""
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    url = os.environ.get("SQLQUEUE_URL")
    pg = None if url else EmbeddedPostgres(fsync=True).start()
    try:
        print(f"PostgreSQL: {'embedded, fsync on' if pg else 'from SQLQUEUE_URL'}; cores: {os.cpu_count()}")
        print(f"messages: {args.messages:,} x {args.size} B bodies; maxMessagesPerTrigger {args.per_trigger:,}\n")
        yield url or pg.url  # type: ignore[union-attr]
    finally:
        if pg is not None:
            pg.stop()


def fill(url: str, queue: str, n: int, size: int, *, random_bodies: bool = False) -> float:
    """Insert n messages with NServiceBus-shaped headers using COPY; returns seconds taken.
    Bodies are `size` repeated bytes, or with `random_bodies` `size` random bytes each (incompressible)."""
    import psycopg

    headers = json.dumps({
        "NServiceBus.MessageId": "x", "NServiceBus.MessageIntent": "Send",
        "NServiceBus.EnclosedMessageTypes": "Shop.Messages.PlaceOrder, Shop.Messages",
        "NServiceBus.ContentType": "application/json", "NServiceBus.ConversationId": str(uuid.uuid4()),
        "NServiceBus.TimeSent": "2026-11-22 00:00:00:000000 Z", "NServiceBus.OriginatingEndpoint": "Shop.Web",
        "NServiceBus.ReplyToAddress": "Shop.Web",
    })
    body = b"x" * size
    t = time.perf_counter()
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy(f'COPY "{queue}" (id, headers, body) FROM STDIN') as copy:
            for _ in range(n):
                copy.write_row((uuid.uuid4(), headers.replace('"x"', f'"{uuid.uuid4()}"', 1),
                                os.urandom(size) if random_bodies else body))
    return time.perf_counter() - t
