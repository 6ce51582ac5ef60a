"""PostgreSQL names: ``table``, ``schema.table``, ``"schema"."table"``."""

from __future__ import annotations

import re
from typing import Any

from ...errors import ConfigError
from ..base import AddressingSql, QueueAddress, Statement

#: a quoted identifier: quotes inside doubled
_QUOTED = re.compile(r'"(?:[^"]|"")*"')


def _whole(part: str, offset: int) -> str:
    """`part` (at `offset` in the address), checked: quoted whole, or not starting with a quote."""
    if not part.startswith('"'):
        return part
    m = _QUOTED.match(part)
    if m is None:
        raise ConfigError(f"the quote at position {offset + 1} is never closed")
    if m.end() != len(part):
        raise ConfigError(f"text after the closing quote at position {offset + m.end()}: a quoted name ends its part")
    return part


class PostgresAddressing(AddressingSql):
    """The PostgreSQL names of the dialect."""

    name = "postgres"
    dot_splits_schema = True
    default_schema = "public"
    max_table_bytes = 63
    #: NServiceBus's PostgreSQL transport keeps 8 of the 63 bytes for its suffixes ("_Seq_seq" of a
    #: queue's sequence, ".Delayed"): PostgreSqlTransportInfrastructure.TableQueueNameLimit
    nservicebus_max_table_bytes = 55
    system_schemas = frozenset({"pg_catalog", "information_schema", "pg_toast"})
    address_example = "'Sales'"

    def is_system_schema(self, schema: str) -> bool:
        # pg_temp_N, pg_toast_temp_N and any future pg_ schema are the server's (names starting
        # with pg_ are reserved: CREATE SCHEMA refuses them)
        return super().is_system_schema(schema) or schema.lower().startswith("pg_")

    def nservicebus_name_problem(self, table: QueueAddress) -> str | None:
        # PostgreSqlTransportInfrastructure, when installers run (SetupInfrastructure) on an
        # endpoint that receives: the table part (UTF-8 bytes) of every queue it creates (its
        # receive and sending addresses) and of its delayed table, over 55, throws at start-up.
        size, limit = self.name_length(table.table), self.nservicebus_max_table_bytes
        if size <= limit:
            return None
        return (f"table name {table.table!r} is {size} bytes; an NServiceBus PostgreSQL endpoint whose installers run "
                f"refuses to start with a queue or <endpoint>.Delayed table name over {limit} bytes "
                "(TableQueueNameLimit)")

    def quote(self, name: str) -> str:
        self.check_name("table", name)
        return '"' + name.replace('"', '""') + '"'

    def split_address(self, text: str) -> QueueAddress:
        """``table``, ``schema.table``, ``"schema"."table"``: split at the first unquoted dot, as
        NServiceBus's QueueAddress.Parse does. A part that starts with a quote is quoted whole
        (``"a""b"`` for ``a"b``): a quote left open, or text after the closing one, is an error
        naming its position (1-based); an unquoted part is taken as it is."""
        quotes, cut = 0, None
        for i, ch in enumerate(text):
            if ch == '"':
                quotes += 1
            elif ch == "." and quotes % 2 == 0:
                cut = i
                break
        if cut is None:
            return QueueAddress(self._unquote(_whole(text, 0)))
        return QueueAddress(self._unquote(_whole(text[cut + 1 :], cut + 1)), self._unquote(_whole(text[:cut], 0)))

    @staticmethod
    def _unquote(part: str) -> str:
        if len(part) >= 2 and part.startswith('"') and part.endswith('"'):
            return part[1:-1].replace('""', '"')
        return part

    def schema_and_tables(self, schema: str, tables: list[str]) -> Statement | None:
        return Statement(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s),"
            " ARRAY(SELECT c.relname::text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = %(default)s AND c.relname = ANY(%(names)s)"
            " ORDER BY length(c.relname), c.relname)",
            {"schema": schema, "default": self.default_schema, "names": list(tables)},
        )

    def format_address(self, address: QueueAddress) -> str:
        schema = address.schema or self.default_schema
        return f"{self.quote(schema)}.{self.quote(address.table)}"

    def _regclass(self, table: QueueAddress) -> tuple[str, dict[str, Any]]:
        return "to_regclass(%(rel)s)", {"rel": self.qualified(table)}
