"""Which queues one stream reads: a list of addresses (``queue`` = ``"Sales, Billing"``) or the
queue tables a pattern matches (``queuePattern`` = ``"tenant_*"."audit"``, ``*.Replies``),
resolved again at each trigger as Kafka's ``subscribePattern`` is."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..dialects import Dialect, QueueAddress
from ..errors import ConfigError, field_error

__all__ = ["QueuePattern", "QueueSelection", "check_distinct", "parse_queue_list", "split_queue_list"]


def split_queue_list(text: str) -> list[str]:
    """The addresses of a comma-separated list, split at commas outside quotes (``"a,b"``) and
    brackets (``[a,b]``): either dialect's quoting keeps a comma inside a name."""
    if not text.strip():
        return [text]  # the address parser says it is empty
    parts, start, quoted, bracket = [], 0, False, False
    for i, ch in enumerate(text):
        if ch == '"' and not bracket:
            quoted = not quoted
        elif ch == "[" and not quoted:
            bracket = True
        elif ch == "]" and not quoted:
            bracket = False
        elif ch == "," and not quoted and not bracket:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    items = [p.strip() for p in parts]
    if any(not p for p in items):
        raise field_error("queue", f"an empty address in the list {text[:200]!r}")
    return items


def _like(glob: str) -> str:
    out, i = [], 0
    while i < len(glob):
        ch = glob[i]
        if ch == "*":
            out.append("%")
        elif ch == "?":
            out.append("_")
        elif ch == "[" and (end := glob.find("]", i + 2)) != -1:
            out.append("_")
            i = end
        elif ch in "%_\\[":
            out.append("\\" + ch)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class QueuePattern:
    """Glob patterns (``*``, ``?``, ``[...]``) over a queue's schema and table name, written in the
    transport's address syntax; without a schema part, the default schema. Compared as the
    database compares names (SQL Server: case-insensitively)."""

    text: str
    table: str
    schema: str | None

    @classmethod
    def parse(cls, dialect: Dialect, text: str) -> QueuePattern:
        raw = str(text).strip()
        if not raw:
            raise field_error("queue_pattern", "is empty: give a pattern such as \"tenant_*\".\"audit\"")
        try:
            address = dialect.split_address(raw)
        except ConfigError as exc:
            raise field_error("queue_pattern", f"invalid pattern {raw!r}: {exc}") from None
        if address.catalog:
            raise field_error("queue_pattern", "a pattern matches queues of the connection's database; "
                              f"it cannot name a catalog ({raw!r})")
        if not address.table:
            raise field_error("queue_pattern", f"{raw!r} has no table part")
        return cls(raw, address.table, address.schema)

    def like(self, dialect: Dialect) -> tuple[str, str]:
        """LIKE patterns (escape character a backslash) for schema and table that every name the
        pattern matches also matches (``[...]`` widened to any one character): the catalog query
        then reads only the candidates, which `matches` judges exactly."""
        return _like(self.schema or dialect.default_schema), _like(self.table)

    def matches(self, dialect: Dialect, schema: str, table: str) -> bool:
        fold = dialect.fold_name
        want = self.schema or dialect.default_schema
        return fnmatch.fnmatchcase(fold(schema), fold(want)) and fnmatch.fnmatchcase(fold(table), fold(self.table))


@dataclass(frozen=True)
class QueueSelection:
    """Listed queues, or a pattern (exactly one of the two)."""

    queues: tuple[QueueAddress, ...] = ()
    pattern: QueuePattern | None = None

    @property
    def single(self) -> QueueAddress | None:
        """The one queue of a one-queue stream (its offsets are the plain `ClaimOffset`)."""
        return self.queues[0] if self.pattern is None and len(self.queues) == 1 else None

    def describe(self, dialect: Dialect) -> str:
        if self.pattern is not None:
            return f"queuePattern {self.pattern.text}"
        return ", ".join(dialect.format_address(q) for q in self.queues)

    def matching(self, rows: Iterable[Any], dialect: Dialect, *, excluded: Iterable[QueueAddress] = (),
                 own_table: Any = None) -> list[QueueAddress]:
        """The queues to read among the catalog's `rows` (schema, table: `Dialect.list_queues`,
        with the pattern's `like`): those the pattern matches except `excluded` (the stream's
        error, audit, forwardTo and monitoring queues) and the transport's own tables
        (`own_table(address)`: claims, staging, outbox, delayed)."""
        assert self.pattern is not None
        skip = {dialect.fold_name(dialect.qualified(q)) for q in excluded}
        found = []
        for schema, table in rows:
            address = QueueAddress(str(table), str(schema))
            if not self.pattern.matches(dialect, str(schema), str(table)):
                continue
            if dialect.fold_name(dialect.qualified(address)) in skip or (own_table is not None and own_table(address)):
                continue
            found.append(address)
        return found


def parse_queue_list(dialect: Dialect, text: str, *, option: str) -> tuple[QueueAddress, ...]:
    """The queues of option `option` (``queue``): one address as given (SQL Server keeps white
    space around a name), or several comma-separated, each named once."""
    texts = split_queue_list(text)
    if len(texts) == 1:
        texts = [text]
    addresses = [dialect.parse_address(t, option=option) for t in texts]
    check_distinct(dialect, addresses)
    return tuple(addresses)


def check_distinct(dialect: Dialect, queues: list[QueueAddress]) -> None:
    """A list naming one queue twice (however spelled) is a mistake: say which."""
    seen: dict[str, QueueAddress] = {}
    for q in queues:
        name = dialect.fold_name(dialect.qualified(q))
        if name in seen:
            raise field_error("queue", f"names queue {dialect.format_address(q)} twice", queue=dialect.format_address(q))
        seen[name] = q

