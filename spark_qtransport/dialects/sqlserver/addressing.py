"""SQL Server names: ``table@[schema]@[catalog]`` as NServiceBus parses them, ``[quoted]]names]``."""

from __future__ import annotations

from ...errors import ConfigError
from ..base import AddressingSql, QueueAddress

#: sysname is nvarchar(128): identifiers are limited to 128 characters (UTF-16 code units)
MAX_NAME_CHARS = 128


def _unquote(part: str) -> str | None:
    """NServiceBus's SafeUnquote: strip one pair of brackets (undoubling ``]]``); blank is None."""
    if len(part) >= 2 and part.startswith("[") and part.endswith("]"):
        part = part[1:-1].replace("]]", "]")
    return part if part.strip() else None


def _next_part(text: str) -> tuple[str, str]:
    """Split off the next ``@``-separated part; inside a bracket-quoted part ``@`` does not count.

    An ``@`` ends a part that does not start with ``[``, or one after an odd number of ``]``
    (the closing bracket: inner ones come doubled). The first character is never a separator.
    """
    closing = 0
    for i in range(1, len(text)):
        ch = text[i]
        if ch == "@" and (text[0] != "[" or closing % 2 == 1):
            return text[:i], text[i + 1 :]
        if ch == "]":
            closing += 1
    return text, ""


class SqlServerAddressing(AddressingSql):
    """The SQL Server names of the dialect."""

    name = "sqlserver"
    default_schema = "dbo"
    max_table_bytes = MAX_NAME_CHARS
    length_unit = "characters"
    address_example = "'Sales' or 'Sales@[dbo]'"
    trims_addresses = False

    # The schemas of the catalog views. System objects elsewhere (change data capture tables,
    # replication tables) are marked is_ms_shipped, which `queue_columns` filters out.
    system_schemas = frozenset({"sys", "information_schema"})
    #: the server's own databases (mssqlsystemresource is the hidden resource database)
    system_catalogs = frozenset({"master", "model", "msdb", "tempdb", "mssqlsystemresource"})

    def fold_name(self, name: str) -> str:
        # Assumes a case-insensitive database collation (SQL Server's default, such as
        # SQL_Latin1_General_CP1_CI_AS), where Sales and SALES name one table: names compare
        # lower-cased. On a case-sensitive database an allow-list entry then also admits the
        # names differing from it only in case.
        return name.lower()

    def name_length(self, name: str) -> int:
        # sysname is nvarchar(128): the limit counts UTF-16 code units, not bytes
        return len(name.encode("utf-16-le")) // 2

    def is_system_catalog(self, catalog: str) -> bool:
        return catalog.lower() in self.system_catalogs

    def quote(self, name: str) -> str:
        self.check_name("identifier", name)
        return "[" + name.replace("]", "]]") + "]"

    def split_address(self, text: str) -> QueueAddress:
        """``table``, ``table@schema``, ``table@[schema]@[catalog]``, as NServiceBus parses them.

        The table is everything before the first ``@``, taken literally: ``[X]`` is a table whose
        name has brackets, as in NServiceBus. Text after the catalog part is ignored, as there.
        """
        table, sep, rest = text.partition("@")
        schema = catalog = None
        if sep:
            part, rest = _next_part(rest)
            schema = _unquote(part)
            if rest:
                part, _ = _next_part(rest)
                catalog = _unquote(part)
        return QueueAddress(table, schema, catalog)

    def check_address(self, address: QueueAddress) -> None:
        if self.check_name("table", address.table).startswith("#"):
            raise ConfigError(
                f"table name {address.table!r} starts with '#', which SQL Server reserves for temporary tables"
            )
        super().check_address(address)

    def format_address(self, address: QueueAddress) -> str:
        """``table@[schema]`` or ``table@[schema]@[catalog]``: NServiceBus's canonical form."""
        if "@" in address.table:
            raise ConfigError(f"table name {address.table!r} contains '@' and cannot be written as an address",
                              queue=address.table)
        text = f"{self.check_name('table', address.table)}@{self.quote(address.schema or self.default_schema)}"
        if address.catalog:
            text += f"@{self.quote(address.catalog)}"
        return text

    def _sys(self, address: QueueAddress) -> str:
        """The catalog views of the address's database: ``sys.`` or ``[catalog].sys.``."""
        return f"{self.quote(address.catalog)}.sys." if address.catalog else "sys."
