"""No error, log or output holds any part of a password: URLs with raw special characters, the
CLI and a Spark stream with a role that must give its password (the embedded PostgreSQL)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import click
import pytest
from click.testing import CliRunner
from test_errors import PASSWORD, WRONG, Role, no_secret, password_role, sqlqueue

from backends import Backend, nsb_headers
from spark_qtransport.connections import mask, parse_url
from spark_qtransport.errors import ConfigError


@pytest.fixture(scope="module")
def role(pg: Backend) -> Iterator[Role]:
    yield from password_role(pg)


# -- parsing -------------------------------------------------------------------------------------


class TestParseUrl:
    def test_raw_special_characters_in_the_password(self) -> None:
        u = parse_url("postgresql://u:p#a/s?s@w rd@127.0.0.1:5432/db")
        assert (u.user, u.password, u.host, u.port, u.database) == ("u", "p#a/s?s@w rd", "127.0.0.1", 5432, "db")
        assert "p#a" not in repr(u) and "w rd" not in str(u)

    def test_percent_encoded_still_decodes(self) -> None:
        u = parse_url("postgresql://us%40er:p%23a%2Fs%3Fs%40w%20rd%25@db.local/shop%20db?sslmode=require")
        assert (u.user, u.password, u.host, u.database) == ("us@er", "p#a/s?s@w rd%", "db.local", "shop db")
        assert u.query == (("sslmode", "require"),)

    def test_user_without_password_and_no_userinfo(self) -> None:
        assert (parse_url("postgresql://app@h/db").user, parse_url("postgresql://app@h/db").password) == ("app", None)
        assert parse_url("postgresql://app:@h/db").password == ""
        u = parse_url("sqlserver://h:1433/Shop")
        assert (u.user, u.password, u.port) == (None, None, 1433)

    @pytest.mark.parametrize(
        ("url", "says"),
        [
            ("postgresql://u:s3cr#t p@ss@h:notaport/db", "is not a valid URL"),
            ("postgresql://u:s3cr#t p@ss@h:99999/db", "is not a valid URL"),
            ("postgresql://u:s3cr#t p@ss@[::1/db", "is not a valid URL"),
            ("postgresql://u:s3cr#t p@ss@/db", "has no host"),
            ("postgresql://u:s3cr#t p@ss@:5432/db", "has no host"),
        ],
    )
    def test_errors_never_show_the_userinfo(self, url: str, says: str) -> None:
        with pytest.raises(ConfigError, match=says) as info:
            parse_url(url, option="url")
        text = str(info.value)
        no_secret(text)
        assert "u:" not in text and "://***@" in text
        assert "percent-encode special characters in the user name and password" in text
        for urllib_words in ("Port could not be cast", "out of range", "Invalid IPv6"):
            assert urllib_words not in text

    def test_other_errors_never_show_the_userinfo(self) -> None:
        for url in ("mysql://u:s3cr#t p@ss@h/db", "u:s3cr#t p@ss@h/db", "postgresql:/u:s3cr#t p@ss@h/db"):
            with pytest.raises(ConfigError) as info:
                parse_url(url)
            no_secret(str(info.value))


class TestMask:
    @pytest.mark.parametrize(
        "text",
        [
            f"could not connect to postgresql://app:{PASSWORD}@db:5432/shop now",
            f"postgresql://app:{PASSWORD}@db/shop and sqlserver://sa:{WRONG}@h/x",
            f"odbc:Driver=x;Server=h;UID=sa;PWD={{{PASSWORD};x}}}}y}};Database=d",
            f"odbc:Driver=x;Password={PASSWORD};UID=sa",
            f"Driver=x;pwd = {{{WRONG}}}",
            f"sqlserver://h/db?password={WRONG}&x=1",
        ],
    )
    def test_hides_every_part_of_the_password(self, text: str) -> None:
        no_secret(mask(text))

    def test_keeps_the_rest(self) -> None:
        assert mask(f"at postgresql://app:{PASSWORD}@db:5432/shop.") == "at postgresql://***@db:5432/shop."
        # masked already: an error's advice after the URL ("@ as %40") stays whole
        masked = "'postgresql://***@h:99999/db' (a port must be a number; @ as %40, : as %3A)"
        assert mask(masked) == masked
        assert mask("odbc:Driver=x;PWD={a;b}}c};UID=sa") == "odbc:Driver=x;PWD=***;UID=sa"
        assert mask("no secrets at https://example.com/x") == "no secrets at https://example.com/x"


def test_cli_port_out_of_range_is_the_whole_message() -> None:
    """Before, the CLI's masking took the advice's "@ as %40" for the end of a password and cut
    the message there: `'postgresql://***@ as %40, ...`."""
    from spark_qtransport.cli import main

    result = CliRunner().invoke(main, ["stats", "--url", f"postgresql://app:{PASSWORD}@127.0.0.1:99999/postgres"])
    assert result.exit_code == 2
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: option '--url' is not a valid URL: 'postgresql://***@127.0.0.1:99999/postgres' "
                           "(a port must be a number from 0 to 65535"), last
    assert last.endswith("% as %25)"), last
    no_secret(result.output)


def test_cli_driver_errors_are_one_masked_line() -> None:
    """The CLI's last resort for an error that is not ours: its first line, URL masked."""
    from spark_qtransport.cli import Group

    @click.group(cls=Group)
    def group() -> None:
        pass

    @group.command()
    def boom() -> None:
        raise RuntimeError(f"cannot reach postgresql://app:{PASSWORD}@db/shop\nDETAIL:  Key (b)=(body-secret)")

    result = CliRunner().invoke(group, ["boom"])
    assert result.exit_code == 1
    assert result.output.strip() == "error: RuntimeError: cannot reach postgresql://***@db/shop"
    no_secret(result.output)


# -- a real role that needs its password ---------------------------------------------------------


@pytest.fixture
def queue(pg: Backend, role: Role, names: Any) -> str:
    q = pg.create_queue(names("Sales"))
    pg.send(q, nsb_headers("m-1"), b'{"body": "secret-free"}')
    with pg.connect() as conn:
        conn.execute(f'GRANT SELECT ON {pg.q(q)} TO "{role.name}"')
    return q


def test_cli_with_a_raw_password(pg: Backend, role: Role, queue: str) -> None:
    result, _ = sqlqueue(role.url(), "stats", queue, "--json")
    assert result.returncode == 0, result.stderr
    [record] = json.loads(result.stdout)
    assert record["messages"] == 1
    no_secret(result.stdout + result.stderr)
    peek, _ = sqlqueue(role.url(), "peek", queue, "--json")
    assert peek.returncode == 0 and json.loads(peek.stdout)[0]["message_id"] == "m-1"
    no_secret(peek.stdout + peek.stderr)


def test_cli_with_a_wrong_password(pg: Backend, role: Role, queue: str) -> None:
    for args in (("stats", queue), ("peek", queue), ("create-queue", queue)):
        result, seconds = sqlqueue(role.url(WRONG), *args)
        assert result.returncode == 1 and seconds < 3, (seconds, result.stderr)
        assert "password authentication failed" in result.stderr and "retrying" not in result.stderr
        assert len(result.stderr.splitlines()) == 1
        no_secret(result.stdout + result.stderr)


def test_stream_with_a_wrong_password(spark: Any, pg: Backend, role: Role, queue: str, names: Any,
                                      checkpoint: str) -> None:
    e = pg.create_queue(names("error"))
    df = (spark.readStream.format("sqlqueue").option("url", role.url(WRONG)).option("queue", queue)
          .option("errorQueue", e).load())
    no_secret(df._jdf.queryExecution().toString())
    query = df.writeStream.format("noop").option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    try:
        with pytest.raises(Exception) as info:  # noqa: PT011 - Spark's wrapper of our error
            query.awaitTermination(120)
    finally:
        query.stop()
    texts = [str(info.value), str(query.exception())]
    cause: BaseException | None = info.value
    while cause is not None:
        texts.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__ or cause.__context__
    text = "\n".join(texts)
    # the first call that reaches the database says so (finding the delayed table, connecting...)
    assert re.search(rf'DatabaseError: [a-z -]+ on queue "public"."{queue}" failed: OperationalError: ', text), text
    assert "password authentication failed" in text
    no_secret(text)
