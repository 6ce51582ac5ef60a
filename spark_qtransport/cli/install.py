"""Installers: create queue, sender and subscription tables, or print their DDL and grants for a DBA."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..dialects import Dialect, QueueAddress, Statement, dialect_named
from ..errors import ConfigError
from ..transport.delayed import DelayedTableRule
from ..transport.operations import privileges
from .app import delayed_options, delayed_rule, main, registered, url_option, usage_url
from .db import open_db, resolve
from .output import echo, echo_script, escape, json_option, show

__all__ = ["DDL_PARTS", "create_queue", "create_outbox", "create_subscriptions", "ddl"]

DDL_PARTS = ("queue", "claims", "batches", "sender", "delayed", "subscriptions")

#: the subscription table's default address
SUBSCRIPTIONS = "SubscriptionRouting"


def _ready(d: Dialect, tables: list[QueueAddress]) -> list[dict[str, Any]]:
    return [{"table": d.qualified(t), "status": "ready"} for t in tables]


@main.command("create-queue")
@click.argument("names", nargs=-1, required=True)
@click.option("--seq-bits", type=click.Choice(["32", "64"]), default="64", show_default=True,
              help="width of the queue's sequence (NServiceBus creates 32)")
@click.option("--delayed", is_flag=True, help="also create each queue's delayed table (<name>.Delayed)")
@click.option("--allow-long-names", is_flag=True,
              help="create tables whose names NServiceBus refuses at start-up (PostgreSQL: over 55 bytes), with a warning")
@delayed_options
@url_option
@json_option
def create_queue(names: tuple[str, ...], seq_bits: str, delayed: bool, allow_long_names: bool,
                 delayed_suffix: str | None, delayed_table: str | None, url: str | None, as_json: bool) -> None:
    """Create queue tables (idempotent; safe to run beside NServiceBus installers). A name an
    NServiceBus endpoint would refuse to start with (PostgreSQL: a queue or delayed table over 55
    bytes) is refused, nothing created, unless --allow-long-names.

    \b
    Examples:
      sqlqueue create-queue Sales Shop.Web '"billing"."Invoices"' --delayed
      sqlqueue create-queue Sales --delayed --delayed-suffix Timeouts   # "Sales.Timeouts"
    """
    if delayed_table is not None and not delayed:
        raise click.UsageError("--delayed-table goes with --delayed")
    rows = []
    with open_db(url) as s:
        d = s.d
        rule = s.delayed_rule(delayed_table, delayed_suffix, names=len(names))
        plans = []
        for name in names:
            address = s.address(name, option="NAME")
            dotted = d.split_address(name.strip())
            if d.dot_splits_schema and dotted.schema is not None and address.schema is None:
                echo(f"note: there is no schema {escape(d.quote(dotted.schema))}, so {escape(name.strip())} is the "
                     f"table {escape(d.qualified(address))} (one name with a dot, as NServiceBus endpoints have); for "
                     f"table {escape(d.quote(dotted.table))} in schema {escape(d.quote(dotted.schema))}, create the "
                     "schema first", err=True)
            if delayed:
                rule.check(d, address, {})
            plans.append([address, *([rule.table_for(d, address)] if delayed else [])])
        problems = [f"{d.qualified(t)}: {p}" for tables in plans for t in tables
                    if (p := d.nservicebus_name_problem(t)) is not None]
        if problems and not allow_long_names:
            raise ConfigError("; ".join(problems) + "; use a shorter name, or --allow-long-names to create it anyway",
                              option="--allow-long-names")
        for problem in problems:
            echo(f"warning: {escape(problem)}", err=True)
        for address, *companions in plans:
            stmts = [*d.create_queue(address, seq_bits=int(seq_bits))]
            for table in companions:
                stmts += d.create_delayed(table)
            s.execute_all(stmts)
            rows += _ready(d, [address, *companions])
    show(rows, as_json)


@main.command("create-outbox")
@click.argument("endpoint")
@url_option
@json_option
def create_outbox(endpoint: str, url: str | None, as_json: bool) -> None:
    """Create a sending endpoint's staging and outbox tables (the sink creates them too).

    \b
    Example:
      sqlqueue create-outbox Shop.Web
    """
    with open_db(url) as s:
        d = s.d
        address = s.address(endpoint, option="ENDPOINT")
        staging, outbox = d.companion(address, "Staging"), d.companion(address, "Outbox")
        s.execute_all([*d.create_staging(staging), *d.create_outbox(outbox)])
    show(_ready(d, [staging, outbox]), as_json)


@main.command("create-subscriptions")
@click.option("--table", default=SUBSCRIPTIONS, show_default=True, help="subscription table address")
@url_option
@json_option
def create_subscriptions(table: str, url: str | None, as_json: bool) -> None:
    """Create the publish/subscribe routing table, as NServiceBus lays it out.

    \b
    Example:
      sqlqueue create-subscriptions
    """
    with open_db(url) as s:
        address = s.address(table, option="--table")
        s.execute_all(s.d.create_subscriptions(address))
    show(_ready(s.d, [address]), as_json)


@main.command("ddl")
@click.option("--dialect", "dialect_name", type=click.Choice(["postgres", "sqlserver"]),
              help="SQL dialect; default: the one --url/$SQLQUEUE_URL names, else postgres")
@click.option("--queue", "queue", default="Sales", show_default=True, help="queue or endpoint address")
@click.option("--part", "parts", multiple=True, type=click.Choice(DDL_PARTS),
              help="what to print (repeatable); default: all")
@click.option("--seq-bits", type=click.Choice(["32", "64"]), default="64", show_default=True)
@click.option("--grant-to", "role", metavar="ROLE",
              help="print the GRANT statements ROLE needs (instead of the DDL); the tables must exist")
@click.option("--for", "kinds", multiple=True, type=click.Choice(["receiving", "sending"]),
              help="with --grant-to: the endpoint kind (repeatable); default: both")
@click.option("--destination", "destinations", multiple=True, metavar="QUEUE",
              help="with --grant-to: a queue the sending endpoint sends to (repeatable)")
@registered("--error-queue", "QUEUE", "with --grant-to: the error queue", with_default=True)
@registered("--audit-queue", "QUEUE", "with --grant-to: the receiving endpoint's audit queue")
@registered("--forward-to", "QUEUE", "with --grant-to: the receiving endpoint's forwardTo queue")
@registered("--monitoring-queue", "QUEUE", "with --grant-to: the receiving endpoint's monitoring queue")
@delayed_options
@url_option
def ddl(dialect_name: str | None, queue: str, parts: tuple[str, ...], seq_bits: str, role: str | None,
        kinds: tuple[str, ...], destinations: tuple[str, ...], error_queue: str, audit_queue: str | None,
        forward_to: str | None, monitoring_queue: str | None, delayed_suffix: str | None,
        delayed_table: str | None, url: str | None) -> None:
    """Print the exact DDL the connector runs, for review by a DBA, or with --grant-to the grants
    a role needs to run once the tables exist (no DDL runs then). Needs no connection, so a dotted
    name such as Shop.Web is one table ("public"."Shop.Web"); quote a schema: '"billing"."Invoices"'.

    \b
    Examples:
      sqlqueue ddl --dialect sqlserver --queue 'Sales@[billing]' --part queue --part delayed
      sqlqueue ddl --grant-to app_role --queue Sales --destination Billing
      sqlqueue ddl --queue Shop.Web --part sender
    """
    d = dialect_named(dialect_name or (usage_url(url).dialect if url else "postgres"))

    def offline(text: str, option: str) -> QueueAddress:
        return d.parse_address(resolve(d, text, option=option, facts=None), option=option)

    address = offline(queue, "--queue")
    rule = delayed_rule(d, None if delayed_table is None else resolve(d, delayed_table, option="--delayed-table",
                                                                       facts=None), delayed_suffix)
    rule.check(d, address, {})
    named = {"auditQueue": ("--audit-queue", audit_queue), "forwardTo": ("--forward-to", forward_to),
             "monitoringQueue": ("--monitoring-queue", monitoring_queue)}
    platform = {option: offline(text, flag) for option, (flag, text) in named.items() if text is not None}
    if role is not None:
        _print_grants(d, role, address, kinds=kinds or ("receiving", "sending"), parts=parts or DDL_PARTS,
                      destinations=[offline(q, "--destination") for q in destinations],
                      error_queue=offline(error_queue, "--error-queue"), delayed=rule, platform=platform)
        return
    if kinds or destinations or platform:
        raise click.UsageError("--for, --destination, --audit-queue, --forward-to and --monitoring-queue go with --grant-to")
    makers = _ddl_makers(d, address, seq_bits=int(seq_bits), delayed=rule)
    for part in parts or DDL_PARTS:
        echo(f"-- {part}: {d.name}")
        echo_script(d.script(makers[part]()))


def _ddl_makers(d: Dialect, address: QueueAddress, *, seq_bits: int,
                delayed: DelayedTableRule) -> dict[str, Callable[[], list[Statement]]]:
    """The statements of each part of `sqlqueue ddl`, made when printed."""
    return {
        "queue": lambda: d.create_queue(address, seq_bits=seq_bits),
        "claims": lambda: d.create_claims(d.claims_table(address)),
        "batches": lambda: d.create_batches(d.batches_table()),
        "sender": lambda: [*d.create_staging(d.companion(address, "Staging")),
                           *d.create_outbox(d.companion(address, "Outbox"))],
        "delayed": lambda: d.create_delayed(delayed.table_for(d, address)),
        "subscriptions": lambda: d.create_subscriptions(d.parse_address(SUBSCRIPTIONS)),
    }


def _print_grants(d: Dialect, role: str, endpoint: QueueAddress, *, kinds: tuple[str, ...], parts: tuple[str, ...],
                  destinations: list[QueueAddress], error_queue: QueueAddress, delayed: DelayedTableRule,
                  platform: dict[str, QueueAddress]) -> None:
    """The grants of `role` for each endpoint kind, limited to the tables of `parts`."""
    for kind in dict.fromkeys(kinds):
        if kind == "receiving":
            needs = privileges.receiving(d, endpoint, error_queue=error_queue, delayed=delayed, platform=platform)
        else:
            needs = privileges.sending(d, endpoint, destinations=destinations, error_queue=error_queue,
                                       subscriptions=d.parse_address(SUBSCRIPTIONS), delayed=delayed)
        needs = [n for n in needs if n.part in parts]
        if not needs:
            continue
        # one line each: a name with a line break must not end the comment
        echo_script(" ".join(f"-- grants for role {role}: {kind} endpoint {d.format_address(endpoint)} ({d.name})".split()))
        for n in needs:
            echo_script("--   " + " ".join(f"{d.qualified(n.table)}: {', '.join(n.privileges)} ({n.why})".split()))
        echo_script(d.script(privileges.grant_statements(d, role, needs)))
