"""Our errors through Spark: `unwrap` gives back the error (class and fields) from whatever Spark
raises, classic or Spark Connect, and Spark's text holds our one line without a Python traceback.
Option values with control characters fail at load(), naming the option."""

from __future__ import annotations

from typing import Any

import pytest

from backends import Backend, nsb_headers
from spark_qtransport import QueueSink, unwrap
from spark_qtransport.errors import (
    ConfigError,
    MessageError,
    QTransportError,
    QueueNotFoundError,
    tagged,
)
from spark_qtransport.options.parse import WRITER_OPTIONS, ReaderOptions, WriterOptions

TRACEBACK = "Traceback (most recent call last)"


def raised(fn: Any) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


# -- without Spark ---------------------------------------------------------------------------------

def test_unwrap_reads_the_tag_back_from_any_text_and_cause() -> None:
    err = tagged(QueueNotFoundError('queue "public"."Sa]les" does not exist', queue='"public"."Sa]les"', option="queue"))
    assert "\n" not in err.message and err.message.endswith("]")
    text = f"[STREAM_FAILED] Query terminated: [X] worker: spark_qtransport.errors.QueueNotFoundError: {err.message}\n SQLSTATE: 38000"
    for exc in (RuntimeError(text), RuntimeError("outer"), err):
        if str(exc) == "outer":
            exc.__cause__ = RuntimeError(text)
        found = unwrap(exc)
        assert type(found) is QueueNotFoundError
        assert found.message == 'queue "public"."Sa]les" does not exist'
        assert found.fields() == {"queue": '"public"."Sa]les"', "option": "queue"}
    assert unwrap(RuntimeError("no tag here [qtransport {not json}]")) is None
    assert unwrap(RuntimeError('[qtransport {"error":"KeyError"}]')) is None  # only our classes
    assert unwrap(None) is None
    plain = MessageError("bad", column="delay")
    assert unwrap(plain) is plain


@pytest.mark.parametrize("parse", [ReaderOptions.parse, WriterOptions.parse])
@pytest.mark.parametrize(("option", "value"), [("endpoint", "Sales\x00"), ("errorQueue", "err\x1b]52;c;x\x07"),
                                               ("password", "s3cret\x00")])
def test_every_option_refuses_control_characters(parse: Any, option: str, value: str) -> None:
    base = {"url": "postgresql://u@127.0.0.1/db", "endpoint": "Sales"}
    if parse is ReaderOptions.parse:
        base["queue"] = "Sales"
    exc = raised(lambda: parse({**base, option: value}))
    assert isinstance(exc, ConfigError) and exc.option == option
    assert "control character" in str(exc)  # why; the option is the field above
    assert "s3cret" not in str(exc) and "\x00" not in str(exc) and "\x1b" not in str(exc)


# -- through Spark -----------------------------------------------------------------------------------

def _source(spark: Any, url: str, queue: str, error: str, **options: str) -> Any:
    reader = spark.readStream.format("sqlqueue").option("url", url).option("queue", queue).option("errorQueue", error)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


#: a row that cannot be a message fails the batch: by default since option invalidRows exists, it
#: goes to the error queue instead
FAIL = {"invalidRows": "fail"} if "invalidRows" in WRITER_OPTIONS else {}


def _nul_ids(received: Any) -> Any:
    return received.selectExpr("body", "concat(message_id, '\\u0000') AS message_id")


def _spark_error(fn: Any) -> tuple[BaseException, QTransportError]:
    exc = raised(fn)
    assert not isinstance(exc, QTransportError)  # what Spark raises: unwrap has work to do
    ours = unwrap(exc)
    assert ours is not None, str(exc)[:2000]
    assert "[qtransport " not in ours.message
    return exc, ours


def _errors_surface(spark: Any, pg: Backend, names: Any, tmp_path: Any, *, connect: bool) -> None:
    sales, billing, error = (pg.create_queue(names(n)) for n in ("Sales", "Billing", "error"))

    # load(): an option error, from the data source's schema() (Connect analyses lazily: .schema)
    exc, ours = _spark_error(lambda: _source(spark, pg.url, sales, error, endpoint="Sales\x00").schema)
    assert type(ours) is ConfigError and ours.option == "endpoint"
    assert TRACEBACK not in str(exc)
    exc, ours = _spark_error(lambda: _source(spark, pg.url, sales + "\x1b", error).schema)
    assert type(ours) is ConfigError and ours.option == "queue"

    # the reader's driver side: a missing queue, when the query starts
    missing = names("Missing")
    exc, ours = _spark_error(lambda: _source(spark, pg.url, missing, error).writeStream.format("console")
                             .option("checkpointLocation", str(tmp_path / "c0")).trigger(availableNow=True)
                             .start().awaitTermination(120))
    assert type(ours) is QueueNotFoundError and ours.option == "queue" and missing in (ours.queue or "")
    assert TRACEBACK not in str(exc)

    # the writer's executors: a row that cannot be a message fails the query
    pg.send_many(sales, [(nsb_headers(f"m{i}"), b"{}") for i in range(3)])
    exc, ours = _spark_error(lambda: _nul_ids(_source(spark, pg.url, sales, error)).writeStream.format("sqlqueue")
                             .option("url", pg.url).option("endpoint", sales).option("destination", billing)
                             .options(**FAIL).option("checkpointLocation", str(tmp_path / "c1")).trigger(availableNow=True)
                             .start().awaitTermination(120))
    assert type(ours) is MessageError and ours.column == "message_id"
    assert TRACEBACK not in str(exc)

    # foreachBatch: QueueSink raises our error itself (a function may catch it); Spark's text has it
    sink = QueueSink(url=pg.url, endpoint=sales, destination=billing, **FAIL)
    caught: list[BaseException] = []

    def handle(batch: Any, batch_id: int) -> None:
        try:
            sink(_nul_ids(batch), batch_id)
        except MessageError as e:
            caught.append(e)
            raise

    exc, ours = _spark_error(lambda: _source(spark, pg.url, sales, error).writeStream.foreachBatch(handle)
                             .option("checkpointLocation", str(tmp_path / "c2")).trigger(availableNow=True)
                             .start().awaitTermination(120))
    assert type(ours) is MessageError and ours.column == "message_id"
    assert "staging.py" not in str(exc)  # the executor's traceback does not travel on
    if not connect:  # classic: the function runs here
        assert caught and caught[0].column == "message_id"  # type: ignore[attr-defined]
    assert pg.count(billing) == 0


def test_our_errors_surface_through_classic_spark(spark: Any, pg: Backend, names: Any, tmp_path: Any) -> None:
    _errors_surface(spark, pg, names, tmp_path, connect=False)


def test_our_errors_surface_through_spark_connect(connect: Any, pg: Backend, names: Any, tmp_path: Any) -> None:
    pytest.importorskip("grpc", reason="Spark Connect's client needs pyspark[connect]")
    _errors_surface(connect, pg, names, tmp_path, connect=True)
