"""A TCP proxy on loopback that can turn into a black hole: it accepts and never answers.

Processes under test connect to Redis through :class:`BlackHoleProxy`. While :meth:`swallow`
is on, every byte either way is dropped (not delayed: what was sent in that time is lost), and
new connections are accepted and then ignored, as a partitioned peer or a half-dead load
balancer does. A client without timeouts then waits for ever on a reply that will never come;
one with timeouts gives up, reconnects and carries on once :meth:`restore` is called.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class BlackHoleProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream`` until told to swallow everything."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self._swallowing = threading.Event()
        self._stop = threading.Event()
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name="black-hole-proxy", daemon=True)
        self._thread.start()

    def url(self, db: int = 0) -> str:
        """A Redis URL through the proxy."""
        return f"redis://127.0.0.1:{self.port}/{db}"

    def swallow(self) -> None:
        """From now on accept, but answer nothing and pass nothing on."""
        self._swallowing.set()

    def restore(self) -> None:
        """Forward again (what was swallowed stays lost)."""
        self._swallowing.clear()

    def close(self) -> None:
        """Stop and close every connection."""
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in [*self._pairs, self._listener]:
            with contextlib.suppress(OSError):
                sock.close()
        self._sel.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    self._accept()
                else:
                    self._relay(sock)

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            client, _ = self._listener.accept()
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                return
            for a, b in ((client, upstream), (upstream, client)):
                a.setblocking(False)
                self._pairs[a] = b
                self._sel.register(a, selectors.EVENT_READ)

    def _relay(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        if self._swallowing.is_set():
            return  # into the hole
        peer = self._pairs.get(sock)
        if peer is not None:
            try:
                peer.setblocking(True)
                peer.sendall(data)
                peer.setblocking(False)
            except OSError:
                self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        peer = self._pairs.pop(sock, None)
        for s in (sock, peer):
            if s is None:
                continue
            self._pairs.pop(s, None)
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(s)
            with contextlib.suppress(OSError):
                s.close()
