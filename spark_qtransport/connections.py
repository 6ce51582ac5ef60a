"""Connection URLs: parse once, pick the dialect, never show a password; connection reuse on executors.

Accepted forms::

    postgresql://user:password@host:5432/db?sslmode=require     (also postgres://)
    sqlserver://user:password@host:1433/db?driver=ODBC+Driver+18+for+SQL+Server&TrustServerCertificate=yes
    mssql://...                                                  (same as sqlserver://)
    odbc:Driver={ODBC Driver 18 for SQL Server};Server=...;      (a raw ODBC connection string)
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from .errors import ConfigError

__all__ = ["ConnectionURL", "parse_url", "mask", "ConnectionCache", "EXECUTOR_CONNECTIONS"]

_SCHEMES = {
    "postgresql": "postgres",
    "postgres": "postgres",
    "sqlserver": "sqlserver",
    "mssql": "sqlserver",
}

_ODBC_SECRET = re.compile(r"(?i)\b(pwd|password)\s*=\s*(\{[^}]*\}|[^;]*)")


def mask(text: str) -> str:
    """Hide passwords in a URL or ODBC connection string (for logs, errors and reprs)."""
    text = re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", text)
    text = _ODBC_SECRET.sub(lambda m: f"{m.group(1)}=***", text)
    text = re.sub(r"(?i)(password=)[^&\s]*", r"\1***", text)
    return text


@dataclass(frozen=True)
class ConnectionURL:
    """A parsed connection URL. `repr` and `str` never show the password."""

    dialect: str  # "postgres" | "sqlserver"
    host: str | None = None
    port: int | None = None
    database: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    query: tuple[tuple[str, str], ...] = ()
    odbc: str | None = field(default=None, repr=False)  # raw ODBC connection string

    def __str__(self) -> str:
        return self.masked

    def __repr__(self) -> str:
        return f"ConnectionURL({self.masked!r})"

    @property
    def masked(self) -> str:
        if self.odbc is not None:
            return "odbc:" + mask(self.odbc)
        auth = ""
        if self.user:
            auth = quote(self.user, safe="") + (":***" if self.password else "") + "@"
        host = self.host or ""
        if self.port:
            host += f":{self.port}"
        q = "&".join(f"{k}={'***' if k.lower() == 'password' else v}" for k, v in self.query)
        scheme = "postgresql" if self.dialect == "postgres" else "sqlserver"
        return f"{scheme}://{auth}{host}/{self.database or ''}" + (f"?{q}" if q else "")

    def with_credentials(self, user: str | None, password: str | None) -> ConnectionURL:
        return ConnectionURL(
            self.dialect, self.host, self.port, self.database,
            user if user is not None else self.user,
            password if password is not None else self.password,
            self.query, self.odbc,
        )

    def key(self) -> tuple[Any, ...]:
        """Identity for connection caches (includes the secret; never print it)."""
        return (self.dialect, self.host, self.port, self.database, self.user, self.password,
                self.query, self.odbc)

    # -- driver-specific forms ----------------------------------------------------------------

    def psycopg_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"host": self.host or "127.0.0.1", "dbname": self.database or "postgres"}
        if self.port:
            kw["port"] = self.port
        if self.user:
            kw["user"] = self.user
        if self.password is not None:
            kw["password"] = self.password
        for k, v in self.query:
            kw[k] = v
        kw.setdefault("application_name", "spark-qtransport")
        kw.setdefault("connect_timeout", "10")
        return kw

    def odbc_string(self) -> str:
        if self.odbc is not None:
            return self.odbc
        q = dict(self.query)
        driver = q.pop("driver", None) or "ODBC Driver 18 for SQL Server"
        parts = [f"Driver={{{driver}}}", f"Server={self.host or '127.0.0.1'},{self.port or 1433}"]
        if self.database:
            parts.append(f"Database={_odbc_value(self.database)}")
        if self.user:
            parts.append(f"UID={_odbc_value(self.user)}")
        if self.password is not None:
            parts.append(f"PWD={_odbc_value(self.password)}")
        for k, v in q.items():
            parts.append(f"{k}={_odbc_value(v)}")
        return ";".join(parts)


def _odbc_value(v: str) -> str:
    # ODBC values with special characters are wrapped in braces, with } doubled.
    if re.search(r"[;{}=\s]", v):
        return "{" + v.replace("}", "}}") + "}"
    return v


def parse_url(url: str, *, option: str = "url") -> ConnectionURL:
    """Parse a connection URL; errors name `option` and never echo the password."""
    if not url or not url.strip():
        raise ConfigError(f"option '{option}' is empty: give a postgresql:// or sqlserver:// URL")
    url = url.strip()
    if url.lower().startswith("odbc:"):
        raw = url[5:]
        if "=" not in raw:
            raise ConfigError(f"option '{option}': 'odbc:' must be followed by an ODBC connection string")
        return ConnectionURL("sqlserver", odbc=raw)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"option '{option}' is not a valid URL: {mask(url)!r} ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"option '{option}' has an unsupported scheme {parts.scheme!r} in {mask(url)!r}: "
            "use postgresql://, sqlserver://, mssql:// or odbc:"
        )
    if not parts.hostname:
        raise ConfigError(f"option '{option}' has no host: {mask(url)!r}")
    database = unquote(parts.path.lstrip("/")) or None
    return ConnectionURL(
        dialect=_SCHEMES[scheme],
        host=parts.hostname,
        port=port,
        database=database,
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        query=tuple(parse_qsl(parts.query, keep_blank_values=True)),
    )


class ConnectionCache:
    """One open connection per URL per process, reused across Spark tasks on an executor.

    Python workers are reused between tasks (spark.python.worker.reuse), so a module-level cache
    saves a connection set-up per partition. A connection that failed is discarded, never reused.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: dict[tuple[Any, ...], Any] = {}

    def get(self, url: ConnectionURL, connect: Callable[[ConnectionURL], Any]) -> Any:
        key = url.key()
        with self._lock:
            conn = self._conns.pop(key, None)
        if conn is not None and not _is_closed(conn):
            return conn
        return connect(url)

    def put(self, url: ConnectionURL, conn: Any) -> None:
        """Return a healthy connection (no open transaction) for reuse."""
        key = url.key()
        with self._lock:
            old = self._conns.get(key)
            self._conns[key] = conn
        if old is not None and old is not conn:
            _close_quietly(old)


def _is_closed(conn: Any) -> bool:
    closed = getattr(conn, "closed", False)
    return bool(closed)


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - closing a broken connection must not mask the real error
        pass


#: idle connections of this Python worker, shared by reads (receive) and staging (send) tasks
EXECUTOR_CONNECTIONS = ConnectionCache()
