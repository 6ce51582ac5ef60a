"""What the PostgreSQL statements of several features share: the UTC clock of Expires, bounded
deletes, and literals for scripts people read."""

from __future__ import annotations

from typing import Any

#: the current time as the wall-clock UTC ``timestamp`` NServiceBus writes into Expires
UTC_NOW = "(now() AT TIME ZONE 'UTC')"


def literal(value: Any) -> str:
    """A literal for scripts people read and run (DO blocks take no parameters); the connector
    otherwise always binds parameters."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


#: Bounded deletes pick their rows once, by physical address, then delete exactly those
#: (`DELETE ... WHERE ctid = ANY(ARRAY(SELECT ctid ... LIMIT n))`): the array is computed once,
#: before the scan, whatever the statistics say. The common `WHERE key IN (SELECT key ... LIMIT n)`
#: is planned as a semi join, and on a table whose statistics say "one row" (last vacuumed empty)
#: as a nested loop that runs the LIMIT query again for every row: 290 s to acknowledge 10,000
#: claims. The delete is then a TID scan. Rows here are only inserted and deleted, never updated,
#: and a tuple our snapshot sees cannot be vacuumed away, so each ctid still names the row picked.
ROWS_OF = "ctid = ANY(ARRAY"
