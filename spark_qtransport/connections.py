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
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from .errors import ConfigError

__all__ = ["ConnectionURL", "parse_url", "mask", "ConnectionCache"]

_SCHEMES = {
    "postgresql": "postgres",
    "postgres": "postgres",
    "sqlserver": "sqlserver",
    "mssql": "sqlserver",
}

# an ODBC PWD= / Password= value: braced (a } inside doubled, unterminated to the end) or up to ;
_ODBC_SECRET = re.compile(r"(?i)\b(pwd|password)\s*=\s*(\{(?:\}\}|[^}])*(?:\}|$)|[^;]*)")
# a URL's userinfo in free text: from :// to the last @ of the line. A password may hold spaces,
# '/', '?', '#', '@' and even '://', so nothing shorter is safe; hiding too much is. A userinfo
# masked already (``://***@``) is left alone: the rest of the line is not a password (an error
# that shows a masked URL and then "@ as %40" kept only its start)
_URL_USERINFO = re.compile(r"://(?!\*\*\*@)[^\r\n]*@")


def mask(text: str) -> str:
    """Hide passwords in text that may hold a URL or an ODBC connection string (for logs, errors
    and reprs): everything between a URL's ``://`` and its last ``@``, and ODBC ``PWD=`` /
    ``Password=`` values."""
    text = _URL_USERINFO.sub("://***@", text)
    text = _ODBC_SECRET.sub(lambda m: f"{m.group(1)}=***", text)
    text = re.sub(r"(?i)(password=)[^&\s]*", r"\1***", text)
    return text


#: seconds of transient faults an operation rides through by default (option `outageTimeout`): as
#: NServiceBus's receive circuit breaker, which raises its critical error after 2 minutes
OUTAGE_TIMEOUT = 120.0
#: seconds a transaction may go without an answer before its server is asked (option `responseTimeout`)
RESPONSE_TIMEOUT = 30.0


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
    #: how this database is waited for (options `outageTimeout`, `responseTimeout`, not part of
    #: the URL): seconds of transient faults ridden through before an operation fails (0: none),
    #: and seconds a transaction may go without an answer before its server is asked whether it is
    #: still working on it (and the connection cut if not: a failover that left it hanging)
    outage: float = field(default=OUTAGE_TIMEOUT, compare=False)
    response: float = field(default=RESPONSE_TIMEOUT, compare=False)

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
        return replace(self, user=user if user is not None else self.user,
                       password=password if password is not None else self.password)

    def waiting(self, *, outage: float | None = None, response: float | None = None) -> ConnectionURL:
        """This URL with how its database is waited for (`outage`, `response`) changed."""
        return replace(self, outage=self.outage if outage is None else outage,
                       response=self.response if response is None else response)

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
        raise ConfigError(f"option '{option}' is empty: give a postgresql:// or sqlserver:// URL", option=option)
    url = url.strip()
    if url.lower().startswith("odbc:"):
        raw = url[5:]
        if "=" not in raw:
            raise ConfigError(f"option '{option}': 'odbc:' must be followed by an ODBC connection string", option=option)
        return ConnectionURL("sqlserver", odbc=raw)
    # The userinfo is split off by hand, at the LAST '@': a password given raw may hold '#', '/',
    # '?', '@' and spaces, which urllib would take for the end of the authority (and then quote
    # in its errors). urllib only ever sees the URL without it; no error shows any part of it.
    scheme_text, sep, rest = url.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme_text):
        raise ConfigError(
            f"option '{option}' is not a valid URL: give postgresql://user:password@host:port/database "
            "or sqlserver://..., or odbc: and an ODBC connection string", option=option
        )
    userinfo, at, hostpart = rest.rpartition("@")
    shown = f"{scheme_text}://{'***@' if at else ''}{hostpart}"
    encode = "; percent-encode special characters in the user name and password (@ as %40, : as %3A, / as %2F, % as %25)"
    scheme = scheme_text.lower()
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"option '{option}' has an unsupported scheme {scheme_text!r} in {shown!r}: "
            "use postgresql://, sqlserver://, mssql:// or odbc:", option=option
        )
    try:
        parts = urlsplit(f"{scheme}://{hostpart}")
        port = parts.port
        host = parts.hostname
    except ValueError:
        raise ConfigError(
            f"option '{option}' is not a valid URL: {shown!r} (a port must be a number from 0 to 65535; "
            f"an IPv6 address goes in brackets){encode}", option=option
        ) from None
    if not host:
        raise ConfigError(f"option '{option}' has no host: {shown!r}{encode}", option=option)
    user: str | None = None
    password: str | None = None
    if at:
        name, colon, secret = userinfo.partition(":")
        user = unquote(name) or None
        password = unquote(secret) if colon else None
    database = unquote(parts.path.lstrip("/")) or None
    return ConnectionURL(
        dialect=_SCHEMES[scheme],
        host=host,
        port=port,
        database=database,
        user=user,
        password=password,
        query=tuple(parse_qsl(parts.query, keep_blank_values=True)),
    )


class _Closable(Protocol):
    """All the cache asks of a connection (the DB-API protocols are the dialects', a room above)."""

    def close(self) -> None: ...


_C = TypeVar("_C", bound=_Closable)


class ConnectionCache(Generic[_C]):
    """One open connection per URL per process, reused across Spark tasks on an executor.

    Python workers are reused between tasks (spark.python.worker.reuse), so a module-level cache
    (`transport.executor.EXECUTOR_CONNECTIONS`) saves a connection set-up per partition. A
    connection that failed is discarded, never reused. `_C`: the connections it holds, as `connect`
    opens them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: dict[tuple[Any, ...], _C] = {}

    def get(self, url: ConnectionURL, connect: Callable[[ConnectionURL], _C]) -> _C:
        key = url.key()
        with self._lock:
            conn = self._conns.pop(key, None)
        if conn is not None and not _is_closed(conn):
            return conn
        return connect(url)

    def put(self, url: ConnectionURL, conn: _C) -> None:
        """Return a healthy connection (no open transaction) for reuse."""
        key = url.key()
        with self._lock:
            old = self._conns.get(key)
            self._conns[key] = conn
        if old is not None and old is not conn:
            _close_quietly(old)


def _is_closed(conn: _Closable) -> bool:
    closed = getattr(conn, "closed", False)
    return bool(closed)


def _close_quietly(conn: _Closable) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - closing a broken connection must not mask the real error
        pass

