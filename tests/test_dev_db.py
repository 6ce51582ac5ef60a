"""sqlqueue dev-db: a local PostgreSQL that stays up until Ctrl-C, used by the other commands."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow(reason="starts and stops PostgreSQL servers of its own, in processes it signals")

SQLQUEUE = [sys.executable, "-m", "spark_qtransport.cli"]


def _start(command: list[str]) -> tuple[subprocess.Popen[str], str, list[str]]:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    while not lines or not lines[-1].startswith("export SQLQUEUE_URL="):
        line = proc.stdout.readline()
        assert line, (lines, proc.communicate(timeout=30))
        lines.append(line)
    return proc, lines[-1].strip().split("=", 1)[1], lines


def _cli(url: str, *args: str) -> str:
    done = subprocess.run([*SQLQUEUE, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SQLQUEUE_URL": url})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _stop(proc: subprocess.Popen[str], sig: int) -> str:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    return out


def _listening(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_dev_db_serves_until_interrupted() -> None:
    """The quick start's first command (getting-started.md): a server until Ctrl-C, then stopped."""
    proc, url, lines = _start([*SQLQUEUE, "dev-db"])
    data = Path(lines[0].split(" data in ", 1)[1].split(" ", 1)[0])
    try:
        assert lines[1] == f"url: {url}\n" and url.startswith("postgresql://postgres@127.0.0.1:")
        _cli(url, "create-queue", "Billing")
        _cli(url, "send", "Billing", "--endpoint", "Shop.Web", "--type", "T", "--body", '{"n": 1}')
        [row] = json.loads(_cli(url, "peek", "Billing", "--json"))
        assert row["body"] == '{"n": 1}' and row["headers"]["NServiceBus.OriginatingEndpoint"] == "Shop.Web"
    finally:
        out = _stop(proc, signal.SIGINT)
    assert out.endswith("PostgreSQL stopped.\n")
    assert not _listening(url) and not data.exists()


def test_ctrl_c_pressed_again_and_again_still_stops_the_server_cleanly() -> None:
    """An impatient user keeps pressing Ctrl-C: while the server stops, and after, until the program ends."""
    import time

    proc, url, lines = _start([*SQLQUEUE, "dev-db"])
    data = Path(lines[0].split(" data in ", 1)[1].split(" ", 1)[0])
    presses = 0
    while proc.poll() is None and presses < 3000:
        proc.send_signal(signal.SIGINT)
        presses += 1
        time.sleep(0.005)
    out = _stop(proc, signal.SIGINT)
    assert presses > 1 and out.endswith("PostgreSQL stopped.\n")
    assert not _listening(url) and not data.exists()


def test_dev_db_keeps_its_data_and_python_m_embedded_does_the_same(tmp_path: Path) -> None:
    keep = tmp_path / "db"
    proc, url, _ = _start([*SQLQUEUE, "dev-db", "--keep", str(keep)])
    try:
        _cli(url, "create-queue", "Sales")
        _cli(url, "send", "Sales", "--endpoint", "Sales", "--type", "T", "--body", "kept")
    finally:
        _stop(proc, signal.SIGTERM)
    assert not _listening(url) and (keep / "data" / "PG_VERSION").exists()
    proc, url, lines = _start([sys.executable, "-m", "spark_qtransport.cli.embedded", "--data-dir", str(keep)])
    try:
        assert "(reused)" in lines[0]
        assert [r["body"] for r in json.loads(_cli(url, "peek", "Sales", "--json"))] == ["kept"]
    finally:
        _stop(proc, signal.SIGINT)
    assert not _listening(url)


def test_a_server_its_program_forgot_to_stop_is_stopped_when_the_program_ends(tmp_path: Path) -> None:
    script = (
        "from spark_qtransport.cli.embedded import EmbeddedPostgres\n"
        "pg = EmbeddedPostgres().start()\n"
        "print(pg.url, pg.base_dir, flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    url, base = done.stdout.split()
    assert not _listening(url) and not Path(base).exists()


def test_dev_db_says_when_its_server_was_killed() -> None:
    """A server killed under it (SIGKILL leaves postmaster.pid behind) ends dev-db with one line
    naming the server's log, exit code 1, instead of a program that runs on as if it were alive."""
    proc, url, lines = _start([*SQLQUEUE, "dev-db"])
    data = Path(lines[0].split(" data in ", 1)[1].split(" ", 1)[0])
    try:
        pid = int(next(data.rglob("postmaster.pid")).read_text().split("\n", 1)[0])
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, (out, err)
    assert out.splitlines()[-1].startswith("PostgreSQL stopped on its own; its log: "), out
    assert "Traceback" not in err and not _listening(url)


def test_a_second_dev_db_on_a_folder_in_use_fails_and_leaves_the_first_running(tmp_path: Path) -> None:
    """`dev-db --keep DIR` twice: the second says which server holds the folder and stops nothing
    (before, its clean-up stopped the running server, and the first dev-db ended with "PostgreSQL
    stopped on its own")."""
    keep = tmp_path / "db"
    first, url, _ = _start([*SQLQUEUE, "dev-db", "--keep", str(keep)])
    try:
        pid = int((keep / "data" / "postmaster.pid").read_text().split("\n", 1)[0])
        port = url.rsplit(":", 1)[1].split("/", 1)[0]
        second = subprocess.run([*SQLQUEUE, "dev-db", "--keep", str(keep)], capture_output=True, text=True, timeout=60)
        assert second.returncode == 1, second
        assert second.stderr.strip() == (f"Error: {keep} is in use: PostgreSQL runs on it (pid {pid}, on 127.0.0.1:"
                                         f"{port}); use that server, stop it first, or keep the data in another folder")
        assert _listening(url) and first.poll() is None
        _cli(url, "create-queue", "Still")
    finally:
        _stop(first, signal.SIGINT)


def test_dev_db_on_a_busy_port_names_the_process_that_holds_it() -> None:
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        done = subprocess.run([*SQLQUEUE, "dev-db", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert done.stderr.startswith(f"Error: port {port} on 127.0.0.1 is in use by pid {os.getpid()} ("), done.stderr
    assert done.stderr.rstrip().endswith("choose another --port, or leave it out for a free one"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.db
def test_a_free_port_taken_before_the_start_is_exchanged_for_another() -> None:
    """A server whose port was picked for it starts on another when something took that port in
    between (three test workers start servers at once; a connection's local port can land on it);
    a port the caller chose is refused instead (above)."""
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    pg = EmbeddedPostgres(fsync=False)
    picked = pg.port
    with socket.create_server(("127.0.0.1", picked)):
        with pg:
            assert pg.port != picked
            assert _listening(pg.url)
