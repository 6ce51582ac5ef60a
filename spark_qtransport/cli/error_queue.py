"""The error queue: list failed messages, send them back to the queue they failed in."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import click

from ..transport.operations.recover import RetryResult, retry_failed
from ..wire import H, decode_headers
from .app import allow_options, main, registered, routing_policy, url_option
from .db import open_db
from .output import json_option, show

__all__ = ["error_group", "error_list", "error_retry"]

#: the failure headers NServiceBus recoverability adds (besides FailedQ and TimeOfFailure)
_EXCEPTION_TYPE = "NServiceBus.ExceptionInfo.ExceptionType"
_EXCEPTION_MESSAGE = "NServiceBus.ExceptionInfo.Message"


def _native_ids(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """Native ids are uuids in both databases: anything else is wrong usage, not a database failure."""
    ids = []
    for text in values:
        try:
            ids.append(str(uuid.UUID(text.strip())))
        except ValueError:
            raise click.BadParameter(f"{text[:60]!r} is not a native id (a uuid such as "
                                     "0f8fad5b-d9cb-469f-a165-70867728950e)", ctx=ctx, param=param) from None
    return tuple(ids)


@main.group("error")
def error_group() -> None:
    """Messages in the error queue: list them, send them back to the queue they failed in."""


@error_group.command("list")
@registered("--queue", "QUEUE", "error queue address", option="errorQueue", with_default=True)
@click.option("-n", "--count", default=20, show_default=True, type=click.IntRange(1, 10_000))
@url_option
@json_option
def error_list(queue: str, count: int, url: str | None, as_json: bool) -> None:
    """The oldest failed messages: where they failed, why and when.

    \b
    Example:
      sqlqueue error list -n 5
    """
    with open_db(url) as s:
        messages = s.peek(s.queue(queue, option="--queue"), limit=count)
    out = []
    for m in messages:
        h = decode_headers(m.headers) or {}
        reason = h.get(_EXCEPTION_MESSAGE) or ""
        out.append({
            "native_id": str(m.native_id).lower(),
            "message_id": h.get(H.MESSAGE_ID),
            "failed_q": h.get(H.FAILED_Q),
            "exception": h.get(_EXCEPTION_TYPE),
            "message": reason if as_json else reason[:60],
            "time_of_failure": h.get(H.TIME_OF_FAILURE),
        })
    show(out, as_json)


@error_group.command("retry")
@click.argument("native_ids", nargs=-1, callback=_native_ids)
@click.option("--all", "retry_all", is_flag=True, help="retry every message (in batches of --batch)")
@registered("--queue", "QUEUE", "error queue address", option="errorQueue", with_default=True)
@click.option("--batch", default=1000, show_default=True, type=click.IntRange(1, 10_000))
@allow_options
@url_option
@json_option
def error_retry(native_ids: tuple[str, ...], retry_all: bool, queue: str, batch: int, allowed_schemas: str | None,
                allowed_queues: str | None, url: str | None, as_json: bool) -> None:
    """Send failed messages back to their NServiceBus.FailedQ, failure headers removed.

    \b
    Examples:
      sqlqueue error retry 0f8fad5b-d9cb-469f-a165-70867728950e
      sqlqueue error retry --all
    """
    if bool(native_ids) == retry_all:
        raise click.UsageError("give the native ids of the messages to retry, or --all")
    policy = routing_policy(allowed_schemas, allowed_queues)
    total = RetryResult()
    with open_db(url) as s:
        address = s.queue(queue, option="--queue")
        while True:
            r = s.run(lambda conn: retry_failed(conn, s.d, address, native_ids=list(native_ids) or None, limit=batch,
                                                policy=policy))
            for name, n in r.moved.items():
                total.moved[name] = total.moved.get(name, 0) + n
            total.kept += r.kept
            if native_ids or not r.moved:
                break
    rows: list[dict[str, Any]] = [{"native_id": "", "to": q, "result": f"{n} sent back"} for q, n in total.moved.items()]
    rows += [{"native_id": i, "to": "", "result": f"kept: {why}"} for i, why in total.kept]
    show(rows, as_json)
    if native_ids and total.kept:
        sys.exit(1)
