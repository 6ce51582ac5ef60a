"""Messages: send one as an NServiceBus endpoint would, move due delayed ones, route published events."""

from __future__ import annotations

import io
import os
import stat
import sys
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

import click

from ..dialects import QueueAddress, dialect_for
from ..errors import QueueNotFoundError
from ..options.parse import parse_duration
from ..transport.sending.dispatch import Dispatcher, DispatchResult, set_up_sender
from ..transport.sending.staging import stage_partition
from ..transport.settings import INVALID_FAIL, SendSettings
from .app import allow_options, delayed_options, delayed_rule, main, need_url, registered, routing_policy, url_option
from .db import CommandDb, open_db, resolve
from .install import SUBSCRIPTIONS
from .output import json_option, show

__all__ = ["MAX_BODY_BYTES", "send", "move_delayed", "subscribe", "unsubscribe", "send_settings"]

F = TypeVar("F", bound=Callable[..., Any])


def send_settings(url: str | None, *, endpoint: str, error_queue: str, destination: str | None = None,
                  create_queues: bool = False, allowed_schemas: str | None = None,
                  allowed_queues: str | None = None, delayed_table: str | None = None,
                  delayed_suffix: str | None = None) -> SendSettings:
    """The sender's settings for a command that sends as `endpoint` (names as `resolve` read them)."""
    parsed = need_url(url)
    return SendSettings.create(parsed, endpoint, destination=destination, error_queue=error_queue,
                               create_queues=create_queues, routing=routing_policy(allowed_schemas, allowed_queues),
                               delayed_rule=delayed_rule(dialect_for(parsed), delayed_table, delayed_suffix),
                               invalid_rows=INVALID_FAIL)  # a command's message: refused out loud


def _header(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{v!r} is not KEY=VALUE", ctx=ctx, param=param)
        out[key] = value
    return out


#: the largest body `send` reads from a file or stdin (it holds the body in memory whole)
MAX_BODY_BYTES = 256 * 2**20


def _read_body(body: str) -> bytes:
    """The --body text, or what @FILE or - (stdin) holds: at most MAX_BODY_BYTES, refused before
    more is read (a device or a pipe may never end)."""
    if body == "-":
        return _bounded(sys.stdin.buffer, "stdin")
    if body.startswith("@"):
        try:
            with open(body[1:], "rb") as f:
                return _bounded(f, repr(body[1:]))
        except OSError as exc:
            raise click.BadParameter(f"cannot read {body[1:]!r}: {exc.strerror or exc}", param_hint="'--body'") from None
    return body.encode("utf-8")


def _bounded(f: BinaryIO, what: str) -> bytes:
    """All of `f`, or a usage error naming --body once it holds more than MAX_BODY_BYTES (a file
    by its size, without reading it; a device or a pipe after reading one byte more)."""
    try:
        info = os.fstat(f.fileno())
        too_large = stat.S_ISREG(info.st_mode) and info.st_size > MAX_BODY_BYTES
    except (OSError, ValueError, io.UnsupportedOperation):  # no file descriptor (a test runner's stdin)
        too_large = False
    data = b"" if too_large else f.read(MAX_BODY_BYTES + 1)
    if too_large or len(data) > MAX_BODY_BYTES:
        raise click.BadParameter(f"{what} holds more than {MAX_BODY_BYTES // 2**20} MB, the largest body "
                                 "sqlqueue send takes", param_hint="'--body'")
    return data


def _resolved(url: str | None, names: dict[str, str]) -> dict[str, str]:
    """Names given on the command line (option -> text) as the sink is to read them (`resolve`)."""
    with open_db(url) as s:
        return {option: resolve(s.d, text, option=option, facts=s.one) for option, text in names.items()}


@main.command("send")
@click.argument("queue", required=False)
@click.option("--body", required=True,
              help=f"message body; @FILE reads a file, - reads stdin (at most {MAX_BODY_BYTES // 2**20} MB)")
@registered("--endpoint", "ENDPOINT", "sending endpoint (OriginatingEndpoint; its .Staging/.Outbox are created on "
            "first use)", required=True)
@click.option("--type", "message_type", help="NServiceBus.EnclosedMessageTypes (a .NET type name)")
@click.option("--header", "headers", multiple=True, callback=_header, metavar="KEY=VALUE", help="header (repeatable)")
@click.option("--id", "message_id", help="NServiceBus.MessageId (default: a new uuid)")
@click.option("--intent", type=click.Choice(["send", "publish", "reply"]), default="send", show_default=True)
@click.option("--delay", help="deliver after this long (30s, 5m, 2h)")
@click.option("--ttbr", help="time to be received (30s, 5m, 2h): becomes Expires")
@click.option("--create-queues", is_flag=True, help="create the queue (and the endpoint's delayed table) when missing")
@registered("--error-queue", "QUEUE", "where a message goes that cannot be delivered (e.g. a subscriber that is not "
            "a queue)", with_default=True)
@delayed_options
@allow_options
@url_option
@json_option
def send(queue: str | None, body: str, endpoint: str, message_type: str | None, headers: dict[str, str],
         message_id: str | None, intent: str, delay: str | None, ttbr: str | None, create_queues: bool,
         error_queue: str, delayed_suffix: str | None, delayed_table: str | None, allowed_schemas: str | None,
         allowed_queues: str | None, url: str | None, as_json: bool) -> None:
    """Send one message as an NServiceBus endpoint would (headers filled in), exactly once.

    \b
    Examples:
      sqlqueue send Billing --endpoint Sales --type Billing.Messages.Charge --body '{"amount": 12}'
      sqlqueue send Billing --endpoint Sales --type Billing.Messages.Remind --body @reminder.json --delay 10m
      sqlqueue send --endpoint Sales --intent publish --type Sales.Events.OrderPlaced --body '{}'
      sqlqueue send Billing --endpoint Shop.Web --type T --body '{}'   # endpoint table "public"."Shop.Web"
      sqlqueue send '"Shop"."Web"' --endpoint Sales --type T --body '{}'   # quoted: schema Shop, table Web
    """
    need_url(url)
    if queue is None and intent != "publish":
        raise click.UsageError("QUEUE is required (only --intent publish sends to the subscribers instead)")
    if not message_type and not headers.get("NServiceBus.EnclosedMessageTypes"):
        raise click.UsageError("--type is required: the message's .NET type name (NServiceBus.EnclosedMessageTypes), "
                               "e.g. --type Billing.Messages.Charge")
    data = _read_body(body)
    names = _resolved(url, {"--endpoint": endpoint, "--error-queue": error_queue,
                            **({"QUEUE": queue} if queue is not None else {}),
                            **({"--delayed-table": delayed_table} if delayed_table is not None else {})})
    destination = None if intent == "publish" else names.get("QUEUE")
    options = send_settings(url, endpoint=names["--endpoint"], error_queue=names["--error-queue"],
                             destination=destination, create_queues=create_queues,
                             allowed_schemas=allowed_schemas, allowed_queues=allowed_queues,
                             delayed_table=names.get("--delayed-table"), delayed_suffix=delayed_suffix)
    row: dict[str, Any] = {"body": data, "message_id": message_id, "message_type": message_type, "headers": headers,
                           "intent": intent, "destination": destination}
    if delay:
        row["delay"] = parse_duration(delay, option="--delay")
    if ttbr:
        row["time_to_be_received"] = parse_duration(ttbr, option="--ttbr")
    show(_sent_rows(options, _send_row(options, row)), as_json)


def _send_row(options: SendSettings, row: dict[str, Any]) -> DispatchResult:
    """Stage one message and dispatch it, as the sink does a batch of one row (its own batch id)."""
    dispatcher = Dispatcher(options)
    try:
        plan = set_up_sender(options)
        report = stage_partition(options, plan, [[row]], batch_id=-1, query_id=None)
        return dispatcher.dispatch(-2 - int.from_bytes(os.urandom(7), "big"), [report])
    finally:
        dispatcher.close()


def _sent_rows(options: SendSettings, result: DispatchResult) -> list[dict[str, Any]]:
    d = options.dialect
    rows: list[dict[str, Any]] = [{"queue": q, "sent": n} for q, n in result.destinations.items()]
    if result.delayed:
        rows.append({"queue": d.qualified(options.delayed), "sent": result.delayed})
    if result.failed:
        rows.append({"queue": f"{d.qualified(options.error_queue)} (could not be delivered)", "sent": result.failed})
    return rows


@main.command("move-delayed")
@click.argument("endpoint")
@registered("--error-queue", "QUEUE", "where undeliverable messages go", with_default=True)
@delayed_options
@allow_options
@url_option
@json_option
def move_delayed(endpoint: str, error_queue: str, delayed_suffix: str | None, delayed_table: str | None,
                 allowed_schemas: str | None, allowed_queues: str | None, url: str | None, as_json: bool) -> None:
    """Deliver the endpoint's due delayed messages now (one mover at a time per table).

    \b
    Examples:
      sqlqueue move-delayed Sales
      sqlqueue move-delayed Sales --delayed-table '"public"."Sales.Delayed"'
    """
    need_url(url)
    names = _resolved(url, {"ENDPOINT": endpoint, "--error-queue": error_queue,
                            **({"--delayed-table": delayed_table} if delayed_table is not None else {})})
    options = send_settings(url, endpoint=names["ENDPOINT"], error_queue=names["--error-queue"],
                             allowed_schemas=allowed_schemas, allowed_queues=allowed_queues,
                             delayed_table=names.get("--delayed-table"), delayed_suffix=delayed_suffix)
    dispatcher = Dispatcher(options)
    try:
        result = dispatcher.move_due()
    finally:
        dispatcher.close()
    d = options.dialect
    if result is None:
        delayed = d.qualified(options.delayed)
        raise QueueNotFoundError(f"endpoint {names['ENDPOINT']} has no delayed table {delayed}", queue=delayed)
    rows = [{"destination": q, "moved": n} for q, n in result.destinations.items()]
    if result.failed:
        rows.append({"destination": d.qualified(options.error_queue), "moved": result.failed})
    if result.busy:
        rows.append({"destination": "(another mover holds the table; try again)", "moved": 0})
    show(rows, as_json)


def _subscription_options(f: F) -> F:
    for option in reversed([
        click.option("--endpoint", required=True, help="the subscribing endpoint's name"),
        click.option("--topic", "topics", required=True, multiple=True, help="event type full name (repeatable)"),
        click.option("--table", default=SUBSCRIPTIONS, show_default=True, help="subscription table address"),
        url_option,
        json_option,
    ]):
        f = option(f)
    return f


def _subscriptions(s: CommandDb, table: str) -> QueueAddress:
    """The subscription table, which must exist (an upsert into a missing table says little)."""
    subs = s.address(table, option="--table")
    if not s.exists(subs):
        name = s.d.qualified(subs)
        raise QueueNotFoundError(f"subscription table {name} does not exist; run sqlqueue create-subscriptions",
                                 queue=name, option="--table")
    return subs


@main.command("subscribe")
@click.argument("queue")
@_subscription_options
def subscribe(queue: str, endpoint: str, topics: tuple[str, ...], table: str, url: str | None, as_json: bool) -> None:
    """Route published events of TOPIC to QUEUE (an upsert per endpoint and topic, as NServiceBus does).

    \b
    Example:
      sqlqueue subscribe Billing --endpoint Billing --topic Sales.Events.OrderPlaced
    """
    with open_db(url) as s:
        queue_text = s.d.format_address(s.queue(queue))
        subs = _subscriptions(s, table)
        for topic in topics:
            s.rowcount(s.d.subscribe(subs, queue_address=queue_text, endpoint=endpoint, topic=topic))
    show([{"endpoint": endpoint, "topic": t, "queue": queue_text} for t in topics], as_json)


@main.command("unsubscribe")
@_subscription_options
def unsubscribe(endpoint: str, topics: tuple[str, ...], table: str, url: str | None, as_json: bool) -> None:
    """Stop routing TOPIC to the endpoint.

    \b
    Example:
      sqlqueue unsubscribe --endpoint Billing --topic Sales.Events.OrderPlaced
    """
    with open_db(url) as s:
        subs = s.address(table, option="--table")
        rows = [{"endpoint": endpoint, "topic": t,
                 "removed": s.rowcount(s.d.unsubscribe(subs, endpoint=endpoint, topic=t))} for t in topics]
    show(rows, as_json)
