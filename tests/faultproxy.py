"""A TCP proxy in front of the test database that can stop forwarding without closing anything.

`freeze()` is the fault a failover or a dead load balancer leaves behind: every connection stays
open, new ones are accepted by the kernel, and no byte goes through in either direction, so a
client waits for an answer that never comes. `thaw()` forwards again; `cut()` closes every
connection (the server going away with a reset); `throttle(n)` forwards at most n bytes a second
on each connection (a slow link: a large read takes minutes), `throttle(None)` at full speed;
`spare_new()` leaves the connections made from then on at full speed (a client's slow reads go
on, a newcomer's work is quick).
"""

from __future__ import annotations

import select
import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit


class FaultProxy:
    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        netloc = parts.netloc.rsplit(":", 1)[0] if parts.port else parts.netloc
        self.url = urlunsplit((parts.scheme, f"{netloc}:{self.port}", parts.path, parts.query, ""))
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._rate: float | None = None
        self._spared_from: float | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def throttle(self, bytes_per_second: float | None) -> None:
        self._rate, self._spared_from = bytes_per_second, None

    def spare_new(self) -> None:
        self._spared_from = time.monotonic()

    def cut(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                _close(sock)

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        _close(self._listener)
        self.cut()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self._flowing.wait()  # a frozen proxy does not even reach the server
        opened = time.monotonic()
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            _close(client)
            return
        server.settimeout(None)
        with self._lock:
            self._pairs.append((client, server))
        ends = {client: server, server: client}
        try:
            while not self._closed.is_set():
                ready, _, _ = select.select(list(ends), [], [], 0.1)
                if not self._flowing.is_set():
                    self._flowing.wait()
                    continue  # what arrived while frozen was dropped with the connection, or goes on now
                for sock in ready:
                    spared = self._spared_from is not None and opened >= self._spared_from
                    rate = None if spared else self._rate
                    data = sock.recv(65536 if rate is None else max(1, int(rate / 10)))
                    if not data:
                        return
                    ends[sock].sendall(data)
                    if rate is not None:
                        time.sleep(len(data) / rate)
        except OSError:
            return
        finally:
            _close(client)
            _close(server)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
