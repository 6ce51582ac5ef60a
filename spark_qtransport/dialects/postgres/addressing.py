"""PostgreSQL names: ``table``, ``schema.table``, ``"schema"."table"``."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from ..base import AddressingSql, QueueAddress, Statement


class PostgresAddressing(AddressingSql):
    """The PostgreSQL names of the dialect."""

    name = "postgres"
    default_schema = "public"
    max_table_bytes = 63
    system_schemas = frozenset({"pg_catalog", "information_schema", "pg_toast"})

    def is_system_schema(self, schema: str) -> bool:
        # pg_temp_N, pg_toast_temp_N and any future pg_ schema are the server's (names starting
        # with pg_ are reserved: CREATE SCHEMA refuses them)
        return super().is_system_schema(schema) or schema.lower().startswith("pg_")

    def quote(self, name: str) -> str:
        self.check_name("table", name)
        return '"' + name.replace('"', '""') + '"'

    @staticmethod
    def _unquote(part: str) -> str:
        if len(part) >= 2 and part.startswith('"') and part.endswith('"'):
            return part[1:-1].replace('""', '"')
        return part

    def parse_address(self, text: str, *, option: str = "queue") -> QueueAddress:
        """``table``, ``schema.table``, ``"schema"."table"``: split at the first unquoted dot."""
        if text is None or not str(text).strip():
            raise ConfigError(f"option '{option}' is empty: give a queue name such as 'Sales'", option=option)
        text = str(text).strip()
        quotes = 0
        schema: str | None = None
        table = text
        for i, ch in enumerate(text):
            if ch == '"':
                quotes += 1
            elif ch == "." and quotes % 2 == 0:
                schema, table = self._unquote(text[:i]), self._unquote(text[i + 1 :])
                break
        else:
            table = self._unquote(text)
        try:
            self.check_name("table", table)
            if schema is not None:
                self.check_name("schema", schema)
        except ConfigError as exc:
            raise ConfigError(f"option '{option}': invalid queue address {text!r}: {exc}", option=option,
                              queue=text) from None
        return QueueAddress(table, schema or None)

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
