"""Property-based tests: header JSON and queue addresses round-trip for any text (hypothesis)."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from backends import Backend, receive_batch
from spark_qtransport.dialects import QueueAddress, dialect_named
from spark_qtransport.errors import ConfigError
from spark_qtransport.wire import decode_headers, encode_headers

# Text as .NET and PostgreSQL hold it: any Unicode scalar value (lone surrogates cannot be stored
# as UTF-8, by NServiceBus or by us) except NUL, which PostgreSQL text refuses.
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
HEADERS = st.dictionaries(TEXT, st.one_of(st.none(), TEXT), max_size=20)
NAME = TEXT.filter(lambda s: s.strip() != "" and s == s.strip())


@settings(max_examples=300, deadline=None)
@given(HEADERS)
def test_headers_round_trip(headers: dict[str, str | None]) -> None:
    text = encode_headers(headers)
    assert decode_headers(text) == headers
    assert all(c in text for k, v in headers.items() for c in k + (v or "") if ord(c) > 0x7F)  # raw, as NSB writes
    assert json.loads(text) == headers  # plain JSON for any reader, "\\/" included


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.lists(TEXT), st.integers(), st.floats(allow_nan=False), st.dictionaries(TEXT, st.one_of(
    st.integers(), st.booleans(), st.lists(TEXT, min_size=1), st.dictionaries(TEXT, TEXT, min_size=1)), min_size=1)))
def test_anything_but_a_flat_string_map_is_poison(value: object) -> None:
    assert decode_headers(json.dumps(value)) is None


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_decoding_never_raises(text: str) -> None:
    decoded = decode_headers(text)
    assert decoded is None or all(v is None or isinstance(v, str) for v in decoded.values())


@pytest.mark.parametrize("dialect", ["postgres", "sqlserver"])
@settings(max_examples=300, deadline=None)
@given(table=NAME, schema=st.one_of(st.none(), NAME), catalog=st.one_of(st.none(), NAME))
def test_addresses_round_trip_through_their_canonical_form(dialect: str, table: str, schema: str | None,
                                                            catalog: str | None) -> None:
    d = dialect_named(dialect)
    if dialect == "postgres":
        catalog = None
        assume(len(table.encode()) <= 63 and (schema is None or len(schema.encode()) <= 63))
    else:
        assume("@" not in table and not table.startswith("#"))
        assume(all(len(p) <= 128 for p in (table, schema or "", catalog or "")))
        if catalog is not None and schema is None:
            schema = "dbo"
    address = QueueAddress(table, schema, catalog)
    try:
        text = d.format_address(address)
    except ConfigError:
        return  # a name the dialect refuses to write (it says so); never a wrong address
    # the canonical form names the default schema when the address had none
    assert d.parse_address(text) == QueueAddress(table, schema or d.default_schema, catalog)
    # the quoted form names one identifier per part, whatever the text
    quoted = d.qualified(address)
    assert quoted.count(d.quote(table)) >= 1


@settings(max_examples=40, deadline=None)
@given(st.lists(HEADERS, min_size=1, max_size=5))
def test_headers_survive_the_database_and_the_claim(pg: Backend, headers_list: list[dict[str, str | None]]) -> None:
    """Any flat string map, sent with NServiceBus's SQL, is claimed (never taken for poison) and
    read back equal; the claim's server-side poison check agrees with the Python one."""
    q, e = pg.create_queue("PropSales"), pg.create_queue("PropErrors")
    for h in headers_list:
        pg.send(q, encode_headers(h), b"x")
    rows = receive_batch(pg, q, e)
    assert [row[2] for row in rows] == headers_list
    assert pg.count(e) == 0
