"""The ``sqlqueue`` group: its options shared by commands (URL, allow-lists) and how errors end a command.

Our errors and the driver's become one line on stderr and exit code 1; wrong usage (a malformed
URL, id or option) is click's usage error, exit code 2; a closed pipe is quiet (exit 141). Every
error line, click's included, has its control characters escaped (`output.escape`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .. import __version__
from ..connections import ConnectionURL
from ..dialects import Dialect
from ..dialects.base import one_line
from ..errors import ConfigError, QTransportError
from ..options.registry import OUTAGE_ENV, URL_ENV, by_name, flag, name_fields
from ..transport.delayed import DelayedTableRule
from ..transport.routing import RoutingPolicy
from .output import echo, escape, escaped_logging, escaped_usage_error

__all__ = ["Group", "main", "registered", "flag_value", "FLAGS", "OUTAGE_ENV", "url_option", "allow_options", "routing_policy", "delayed_options", "delayed_rule",
           "need_url", "usage_url", "command_what"]

F = TypeVar("F", bound=Callable[..., Any])

def registered(cli: str, metavar: str, help: str, *, option: str | None = None, with_default: bool = False,
               dest: str | None = None, **click_options: Any) -> Callable[[F], F]:
    """The flag `cli` of an option of the registry (`options.registry`; `option` names it where
    the flag is not the option's own, as `error list --queue`): its environment variable from
    there, its help saying which option of the source and the sink it matches, and with
    `with_default` the option's default (the flag's value when not given); `dest` the function's
    parameter where it is not the flag's name. `click_options` (``multiple``, ``required``) go to
    click as they are."""
    o = flag(cli) if option is None else by_name(option)
    env = f"; ${o.env}" if o.env else ""
    if with_default:
        click_options.update(default=o.default, show_default=True)
    names = (cli, dest) if dest else (cli,)
    return click.option(*names, envvar=o.env, metavar=metavar, help=f"{help} (the option {o.name}{env})",
                        **click_options)


def flag_value(cli: str, raw: str | None, *, dialect: Dialect | None = None) -> Any:
    """The value of flag `cli` as the registry parses and checks it (its default when not given;
    a queue address by `dialect`); a bad one is a `ConfigError` naming the flag."""
    return flag(cli).parse(raw, flag=True, dialect=dialect)


def url_option(f: F) -> F:
    return registered("--url", "URL", "database URL (postgresql://..., sqlserver://..., odbc:...)")(f)


def allow_options(f: F) -> F:
    """The allow-list for queue addresses that come from message data: addresses outside it are
    refused like missing queues."""
    f = registered("--allowed-queues", "PATTERNS",
                   "comma-separated name patterns addresses from messages may name (default: any)")(f)
    return registered("--allowed-schemas", "SCHEMAS",
                      "comma-separated schemas addresses from messages may name (default: any but system schemas)")(f)


def routing_policy(schemas: str | None, queues: str | None) -> RoutingPolicy:
    return RoutingPolicy.allowing(flag_value("--allowed-schemas", schemas), flag_value("--allowed-queues", queues))


def delayed_options(f: F) -> F:
    """Where an endpoint's delayed table is."""
    f = registered("--delayed-table", "ADDRESS", "the endpoint's delayed table, where NServiceBus's is not "
                   "<endpoint>.<suffix> beside its queue (one endpoint only)")(f)
    return registered("--delayed-suffix", "SUFFIX", "delayed tables are <endpoint>.<SUFFIX>: NServiceBus's "
                      "DelayedDelivery.TableSuffix (default: Delayed)")(f)


#: settings fields the transport names that a command's own flag sets (beside the registry's)
FLAGS = {"role": "--grant-to", "limit": "--limit", "native_ids": "NATIVE_IDS", "endpoint": "--endpoint",
         "topic": "--topic", "destination": "QUEUE", "create_queues": "--create-queues"}


def delayed_rule(d: Dialect, table: str | None, suffix: str | None, *, names: int = 1) -> DelayedTableRule:
    """The rule the --delayed-table / --delayed-suffix flags give; `table` as `db.resolve` read it.
    A --delayed-table is one endpoint's: wrong usage with `names` other than one."""
    if table is not None and names != 1:
        raise click.UsageError("--delayed-table names one endpoint's delayed table: give one queue with it")
    return DelayedTableRule.create(d, table=flag_value("--delayed-table", table, dialect=d), suffix=suffix)


def need_url(url: str | None) -> ConnectionURL:
    """The --url of a command that connects: missing or malformed is wrong usage (exit 2). It
    waits out an outage for the group's --outage-timeout."""
    if not url:
        raise click.UsageError(f"--url is required (or set {URL_ENV}), e.g. postgresql://postgres@127.0.0.1:5432/postgres")
    parsed = usage_url(url)
    ctx = click.get_current_context(silent=True)
    outage = ctx.find_root().params.get("outage_timeout") if ctx is not None else None
    if outage is None:
        return parsed
    try:
        return parsed.waiting(outage=flag_value("--outage-timeout", outage))
    except ConfigError as exc:
        raise click.UsageError(one_line(exc.message)) from None


def usage_url(url: str) -> ConnectionURL:
    """A malformed URL is wrong usage (exit 2); one that parses but does not connect is not."""
    try:
        return flag_value("--url", url)
    except ConfigError as exc:
        raise click.UsageError(one_line(exc.message)) from None


def command_what() -> str:
    """What the running command is called in errors: ``sqlqueue error retry``."""
    ctx = click.get_current_context(silent=True)
    return f"sqlqueue {ctx.command_path.split(' ', 1)[-1]}" if ctx is not None else "sqlqueue"


def _quiet_broken_pipe() -> None:
    """The reader went away (``sqlqueue ddl | head -1``): no traceback, no flush error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (a test runner's buffer)
        pass
    sys.exit(141)  # 128 + SIGPIPE, as a shell reports a command a pipe stopped


class Group(click.Group):
    """Turns our errors and database errors into one line and exit code 1."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            try:
                with escaped_logging():
                    return super().main(*args, **kwargs)
            finally:
                sys.stdout.flush()  # here, where a closed pipe can still be quieted
        except BrokenPipeError:
            _quiet_broken_pipe()

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.ClickException as exc:  # the group's own options
            escaped_usage_error(exc)
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:  # a command's arguments, or its own usage error
            escaped_usage_error(exc)
            raise
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:
            _quiet_broken_pipe()
        except QTransportError as exc:
            exc = name_fields(exc, cli=FLAGS)  # a settings field the transport names: the flag's name
            echo(f"error: {escape(exc)}", err=True)  # one line, whatever a name in it holds
            sys.exit(1)
        except Exception as exc:  # noqa: BLE001 - a driver error: its first line, passwords masked
            # (later lines may quote a row; a dialect's error_text knows more, none is at hand)
            text = one_line(str(exc)) or type(exc).__name__
            echo(f"error: {type(exc).__name__}: {escape(text)}", err=True)
            sys.exit(1)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="sqlqueue", message="%(prog)s %(version)s")
@registered("--outage-timeout", "DURATION",
            "how long a command waits out a database outage (30s, 2m; 0: fail at the first fault); default 2m")
@click.pass_context
def main(ctx: click.Context, outage_timeout: str | None) -> None:
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
    from ..transport.session import OUTAGES

    OUTAGES.starts_here()  # a wrong address fails in seconds; the outage bound is for a server that answered
