"""Options and URLs: bad input fails at load() with a message naming the option; no password leaks."""

from __future__ import annotations

import pickle

import pytest

from spark_qtransport.connections import mask, parse_url
from spark_qtransport.errors import ConfigError, QTransportError, QueueNotFoundError
from spark_qtransport.options.parse import ReaderOptions, WriterOptions
from spark_qtransport.spark.reader import SqlQueueStreamReader

URL = "postgresql://app:s3cr3t-pw@127.0.0.1:5432/db"


class TestReaderOptions:
    def test_minimal(self) -> None:
        o = ReaderOptions.parse({"url": URL, "queue": "Sales"})
        assert o.queue.table == "Sales" and o.queue.schema is None
        assert o.consumer == "Sales"
        assert o.error_queue.table == "error"
        assert o.max_messages == 10_000

    def test_keys_are_case_insensitive(self) -> None:
        o = ReaderOptions.parse({"URL": URL, "Queue": "Sales", "MAXMESSAGESPERTRIGGER": "7", "Endpoint": "Billing"})
        assert o.max_messages == 7 and o.consumer == "Billing"

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"url": URL}, "option 'queue' is required"),
            ({"url": URL, "queue": "  "}, "option 'queue' is empty"),
            ({"url": URL, "queue": "Sales", "colour": "red"}, "unknown option.*'colour'"),
            ({"url": "mysql://h/db", "queue": "Sales"}, "option 'url' has an unsupported scheme"),
            ({"url": "postgresql://h:notaport/db", "queue": "Sales"}, "option 'url' is not a valid URL"),
            ({"url": "postgresql:///db", "queue": "Sales"}, "option 'url' has no host"),
            ({"url": URL, "queue": "Sales", "maxMessagesPerTrigger": "lots"}, "option 'maxMessagesPerTrigger' must be a whole number"),
            ({"url": URL, "queue": "Sales", "maxMessagesPerTrigger": "0"}, "option 'maxMessagesPerTrigger' must be at least 1"),
            ({"url": URL, "queue": "Sales", "numPartitions": "-2"}, "option 'numPartitions' must be at least 1"),
            ({"url": URL, "queue": "Sales", "createQueues": "maybe"}, "option 'createQueues' must be true or false"),
            ({"url": URL, "queue": "x" * 70}, "option 'queue': invalid queue address"),
            ({"url": URL, "queue": "Sales", "errorQueue": '"public"."Sales"'}, "option 'errorQueue' must name another queue"),
            ({"url": URL, "queue": "bad\x00name"}, "option 'queue'.*NUL"),
            ({"url": URL, "queue": "Sales", "endpoint": " "}, "option 'endpoint' is empty"),
        ],
    )
    def test_bad_options_name_the_option(self, options: dict[str, str], message: str) -> None:
        with pytest.raises(ConfigError, match=message) as info:
            ReaderOptions.parse(options)
        assert "s3cr3t" not in str(info.value)

    def test_url_from_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("SQLQUEUE_URL", URL)
        assert ReaderOptions.parse({"queue": "Sales"}).url.host == "127.0.0.1"
        monkeypatch.delenv("SQLQUEUE_URL")
        with pytest.raises(ConfigError) as info:
            ReaderOptions.parse({"queue": "Sales"})
        assert info.value.option == "url" and "SQLQUEUE_URL" in str(info.value)

    def test_password_option_overrides_url(self) -> None:
        o = ReaderOptions.parse({"url": "postgresql://app@db.example/x", "queue": "Sales", "password": "pw2"})
        assert o.url.password == "pw2"
        assert "pw2" not in repr(o) and "pw2" not in str(o.url)


class TestMasking:
    def test_url_repr_hides_password(self) -> None:
        u = parse_url(URL)
        assert u.password == "s3cr3t-pw"
        for text in (repr(u), str(u), u.masked):
            assert "s3cr3t" not in text
            assert "app:***@127.0.0.1:5432" in text

    def test_reader_repr_and_pickled_partition_repr(self) -> None:
        reader = SqlQueueStreamReader(ReaderOptions.parse({"url": URL, "queue": "Sales"}))
        assert "s3cr3t" not in repr(reader)

    @pytest.mark.parametrize(
        "text",
        [
            "postgresql://u:s3cr3t-pw@h/db",
            "odbc:Driver={ODBC Driver 18 for SQL Server};Server=h;UID=sa;PWD=s3cr3t-pw;",
            "odbc:Driver=x;Password={s3cr3t-pw;with;semis};",
            "sqlserver://h/db?password=s3cr3t-pw&x=1",
        ],
    )
    def test_mask(self, text: str) -> None:
        assert "s3cr3t" not in mask(text)
        assert "s3cr3t" not in parse_url(text).masked

    def test_sqlserver_url_to_odbc(self) -> None:
        u = parse_url("sqlserver://sa:p%3Bw@sql.local:1433/Shop?TrustServerCertificate=yes")
        s = u.odbc_string()
        assert s.startswith("Driver={ODBC Driver 18 for SQL Server};Server=sql.local,1433;Database=Shop;UID=sa;")
        assert "PWD={p;w}" in s and "TrustServerCertificate=yes" in s
        assert "p;w" not in repr(u)


class TestErrors:
    def test_errors_pickle(self) -> None:
        for exc in (ConfigError("option 'queue' is required"), QueueNotFoundError("queue x")):
            again = pickle.loads(pickle.dumps(exc))
            assert type(again) is type(exc) and str(again) == str(exc)
            assert isinstance(again, QTransportError)


def test_a_queue_too_long_for_a_delayed_table_still_receives() -> None:
    """NServiceBus keeps queue names to 55 bytes so that `.Delayed` fits; a longer one (up to 56,
    where `.Claims` still fits) is received from, just without a delayed-message mover."""
    from spark_qtransport.transport.receiving.receiver import Receiver

    receiver = Receiver(ReaderOptions.parse({"url": URL, "queue": "q" * 56}))
    assert receiver.claims.table == "q" * 56 + ".Claims"
    with pytest.raises(ConfigError, match="too long"):
        WriterOptions.parse({"url": URL, "endpoint": "q" * 56})


class TestWriterOptions:
    def test_defaults(self) -> None:
        o = WriterOptions.parse({"url": URL, "endpoint": "Sales"})
        assert (o.sink, o.retention_seconds, o.create_queues, o.destination) == ("default", 7 * 86400, False, None)
        assert (o.staging.table, o.outbox.table, o.delayed.table) == ("Sales.Staging", "Sales.Outbox", "Sales.Delayed")
        assert o.subscriptions.table == "SubscriptionRouting" and o.error_queue.table == "error"

    @pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("12h", 43200), ("7d", 604800), ("90", 90), ("1500ms", 1)])
    def test_retention_durations(self, text: str, seconds: int) -> None:
        assert WriterOptions.parse({"url": URL, "endpoint": "S", "deduplicationRetention": text}).retention_seconds == seconds

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({}, "option 'endpoint' is required"),
            ({"endpoint": "S", "destinaton": "B"}, "unknown option.*'destinaton'"),
            ({"endpoint": "S", "deduplicationRetention": "a week"}, "option 'deduplicationRetention' must be a duration"),
            ({"endpoint": "S", "createQueues": "maybe"}, "option 'createQueues' must be true or false"),
            ({"endpoint": "S", "destination": " "}, "option 'destination'"),
            ({"endpoint": "S", "sinkName": "x" * 201}, "option 'sinkName'"),
        ],
    )
    def test_bad_options_name_the_option(self, options: dict[str, str], message: str) -> None:
        with pytest.raises(ConfigError, match=message):
            WriterOptions.parse({"url": URL, **options})

    def test_spark_and_queue_sink_options_are_accepted(self) -> None:
        o = WriterOptions.parse({"url": URL, "endpoint": "S", "checkpointLocation": "/tmp/x", "_batchId": "7", "_queryId": "q"})
        assert (o.batch_id, o.query_id) == (7, "q")


@pytest.mark.parametrize(
    ("option", "cap"),
    [("maxMessagesPerTrigger", 10_000_000), ("numPartitions", 10_000), ("ackBatchSize", 1_000_000)],
)
def test_integer_options_are_capped(option: str, cap: int) -> None:
    assert ReaderOptions.parse({"url": URL, "queue": "Sales", option: str(cap)})
    for too_big in (cap + 1, 2**63 - 1, 2**63, 10**100):
        with pytest.raises(ConfigError) as info:
            ReaderOptions.parse({"url": URL, "queue": "Sales", option: str(too_big)})
        assert info.value.option == option and f"{cap:,}" in str(info.value)
    with pytest.raises(ConfigError) as info:
        ReaderOptions.parse({"url": URL, "queue": "Sales", option: "9" * 5000})  # past int()'s digit limit
    assert info.value.option == option and "whole number" in str(info.value)


def test_retention_is_capped() -> None:
    assert WriterOptions.parse({"url": URL, "endpoint": "S", "deduplicationRetention": "3650d"}).retention_seconds == 3650 * 86400
    for text in ("3651d", "9" * 400 + "d"):
        with pytest.raises(ConfigError) as info:
            WriterOptions.parse({"url": URL, "endpoint": "S", "deduplicationRetention": text})
        assert info.value.option == "deduplicationRetention" and "3650d" in str(info.value)


def test_index_names_always_fit_and_tables_too_long_fail_at_parse() -> None:
    """PostgreSQL cuts identifiers to 63 bytes without an error: an index of ours whose plain name
    `<endpoint>.Outbox_dispatched` would not fit gets a shortened one with a digest; a companion
    table that would not fit fails when the options are parsed."""
    from spark_qtransport.dialects import dialect_named

    d = dialect_named("postgres")
    fits = "e" * (63 - len(".Outbox_dispatched"))
    assert d.index_name(WriterOptions.parse({"url": URL, "endpoint": fits}).outbox, "dispatched") == fits + ".Outbox_dispatched"
    longest = "é" * 27  # 54 bytes: its tables fit (NServiceBus allows 55), the plain index names do not
    options = WriterOptions.parse({"url": URL, "endpoint": longest})
    names = {d.index_name(t, s) for t, s in ((options.outbox, "dispatched"), (options.staging, "route"),
                                             (options.delayed, "Due"))}
    assert len(names) == 3 and all(len(n.encode()) <= 63 for n in names)
    for stmt in d.create_outbox(options.outbox) + d.create_staging(options.staging):
        assert stmt.sql  # quoting checks every name's length
    with pytest.raises(ConfigError) as info:
        WriterOptions.parse({"url": URL, "endpoint": "e" * 56})  # the staging table itself
    assert info.value.option == "endpoint" and "Staging" in str(info.value) and "too long" in str(info.value)
    with pytest.raises(ConfigError) as info:
        ReaderOptions.parse({"url": URL, "queue": "q" * 57})
    assert info.value.option == "queue" and "Claims" in str(info.value) and "too long" in str(info.value)
    # SQL Server's indexes have fixed names: only its 128-character table names count
    sqlserver = "sqlserver://app@db.example.com/shop"
    assert WriterOptions.parse({"url": sqlserver, "endpoint": "e" * 100}).delayed.table == "e" * 100 + ".Delayed"


def test_retry_acknowledgements_are_on_unless_turned_off() -> None:
    def acks(**options: str) -> bool:
        settings = ReaderOptions.stream({"url": URL, "queue": "audit, error", "errorQueue": "poison", **options})
        return all(settings.settings_for(q).acknowledge_retries for q in settings.selection.queues)

    assert acks() is True and acks(RetryAcknowledgements="false") is False


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"queue": "Sales", "maxMessagesPerTrigger": "lots"}, "maxMessagesPerTrigger"),
        ({"queue": "Sales", "claimAhead": "maybe"}, "claimAhead"),
        ({"queue": "Sales", "retryAcknowledgements": "no thanks"}, "retryAcknowledgements"),
        ({"queue": "Sales", "url": "mysql://h/db"}, "url"),
        ({"queue": "Sales", "colour": "blue"}, "colour"),
        ({"url": URL}, "queue"),
        ({"queue": "Sales", "errorQueue": "Sales"}, "errorQueue"),
    ],
)
def test_option_errors_name_the_option_in_a_field(options: dict[str, str], option: str) -> None:
    """Code that handles errors reads the field; people read the message, which names it too."""
    with pytest.raises(ConfigError) as info:
        ReaderOptions.parse({"url": URL, **options})
    assert info.value.option is not None and info.value.option.lower() == option.lower()
    assert option.lower() in str(info.value).lower()


class TestDelayedTableOptions:
    """NServiceBus names an endpoint's delayed table `<endpoint name>.<TableSuffix>` in its default
    schema (`DefaultSchema`, which also holds the endpoint's own queue): by default, the table
    beside the endpoint's queue. `delayedTableSuffix` and `delayedTable` say otherwise."""

    SQLSERVER = "sqlserver://app@db.example.com/shop"

    @pytest.mark.parametrize(
        ("url", "address", "table"),
        [
            (URL, "Sales", ("Sales.Delayed", None, None)),
            (URL, "billing.Sales", ("Sales.Delayed", "billing", None)),
            (URL, '"Shop.Web"', ("Shop.Web.Delayed", None, None)),
            (SQLSERVER, "Sales@[billing]@[shop]", ("Sales.Delayed", "billing", "shop")),
        ],
    )
    def test_default_is_nservicebus_rule_beside_the_queue(self, url: str, address: str, table: tuple) -> None:
        from spark_qtransport.dialects import QueueAddress

        reader = ReaderOptions.parse({"url": url, "queue": address})
        writer = WriterOptions.parse({"url": url, "endpoint": address})
        assert reader.delayed == writer.delayed == QueueAddress(*table)
        assert reader.delayed_rule.suffix == writer.delayed_rule.suffix == "Delayed"

    def test_suffix_and_table(self) -> None:
        from spark_qtransport.dialects import QueueAddress

        o = WriterOptions.parse({"url": URL, "endpoint": "billing.Sales", "DelayedTableSuffix": "Timeouts"})
        assert o.delayed == QueueAddress("Sales.Timeouts", "billing")
        r = ReaderOptions.parse({"url": URL, "queue": "Sales", "delayedTableSuffix": "Timeouts"})
        assert r.delayed == QueueAddress("Sales.Timeouts")
        # the endpoint's queue moved by UseSchemaForQueue: its delayed table stays in the default schema
        o = WriterOptions.parse({"url": URL, "endpoint": "billing.Sales", "delayedTable": 'public."Sales.Delayed"'})
        assert o.delayed == QueueAddress("Sales.Delayed", "public") and o.staging == QueueAddress("Sales.Staging", "billing")
        r = ReaderOptions.parse({"url": URL, "queue": "Orders", "delayedTable": '"Sales.Delayed"'})
        assert r.delayed == QueueAddress("Sales.Delayed")
        s = WriterOptions.parse({"url": self.SQLSERVER, "endpoint": "Orders@[billing]", "delayedTable": "Sales.Delayed"})
        assert s.delayed == QueueAddress("Sales.Delayed")  # a dot is part of a SQL Server table name

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"delayedTableSuffix": ""}, "option 'delayedTableSuffix': .*empty"),
            ({"delayedTableSuffix": "  "}, "option 'delayedTableSuffix': .*empty"),
            ({"delayedTableSuffix": "a\x00b"}, "option 'delayedTableSuffix': .*NUL"),
            ({"delayedTableSuffix": "Claims"}, "option 'delayedTableSuffix': 'Claims' names a table of the transport"),
            ({"delayedTableSuffix": "Outbox"}, "option 'delayedTableSuffix': 'Outbox' names a table of the transport"),
            ({"delayedTableSuffix": "x" * 60}, "option 'delayedTableSuffix': .*too long"),
            ({"delayedTable": ""}, "option 'delayedTable' is empty"),
            ({"delayedTable": "x" * 70}, "option 'delayedTable': invalid queue address"),
            ({"delayedTable": "Sales"}, "option 'delayedTable': \"public\".\"Sales\" is the endpoint's queue"),
            ({"delayedTable": '"Sales.Claims"'}, "option 'delayedTable': .* is the endpoint's .Claims table"),
            ({"delayedTable": '"Sales.Staging"'}, "option 'delayedTable': .* is the endpoint's .Staging table"),
            ({"delayedTable": "public.error"}, "option 'delayedTable': .* is option 'errorQueue'"),
        ],
    )
    def test_bad_values_name_the_option(self, options: dict[str, str], message: str) -> None:
        for parse, key in ((ReaderOptions.parse, "queue"), (WriterOptions.parse, "endpoint")):
            with pytest.raises(ConfigError, match=message) as info:
                parse({"url": URL, key: "Sales", **options})
            assert info.value.option in ("delayedTable", "delayedTableSuffix")

    def test_writer_refuses_its_destination_and_subscription_table(self) -> None:
        for option in ("destination", "subscriptionTable"):
            with pytest.raises(ConfigError) as info:
                WriterOptions.parse({"url": URL, "endpoint": "Sales", option: "Billing", "delayedTable": "Billing"})
            assert info.value.option == "delayedTable" and f"option '{option}'" in str(info.value)

    def test_routing_refuses_the_delayed_tables_the_options_name(self) -> None:
        from spark_qtransport.dialects import QueueAddress, dialect_named

        d = dialect_named("postgres")
        plain = WriterOptions.parse({"url": URL, "endpoint": "Sales"}).routing
        o = WriterOptions.parse({"url": URL, "endpoint": "Sales", "delayedTableSuffix": "Timeouts",
                                 "delayedTable": "ops.deferred"})
        for own in (QueueAddress("Billing.Timeouts"), QueueAddress("Sales.Timeouts", "x"), QueueAddress("deferred", "ops"),
                    QueueAddress("Billing.Delayed")):
            assert o.routing.is_own_table(d, own), own
        assert not plain.is_own_table(d, QueueAddress("Billing.Timeouts"))
        assert not o.routing.is_own_table(d, QueueAddress("deferred")) and not o.routing.is_own_table(d, QueueAddress("Billing"))
        r = ReaderOptions.parse({"url": URL, "queue": "Sales", "delayedTableSuffix": "Timeouts"}).routing
        assert r.is_own_table(d, QueueAddress("Billing.Timeouts"))
        # SQL Server compares names without case (its default collation)
        s = WriterOptions.parse({"url": self.SQLSERVER, "endpoint": "Sales", "delayedTableSuffix": "Timeouts"}).routing
        assert s.is_own_table(dialect_named("sqlserver"), QueueAddress("Billing.TIMEOUTS"))
