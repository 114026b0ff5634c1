"""The HTTP side of ``kvforensics serve``: ``/metrics`` through prometheus-client's own handler (content
negotiation, OpenMetrics, gzip, ``name[]`` filters), ``/healthz``, and where the socket comes from.

Standard library HTTP server, one thread per request: a slow client holds up no other. A scrape or
a probe that arrives during a sample waits for that sample and shares it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Optional, Tuple
from urllib.parse import urlparse

from prometheus_client import MetricsHandler

from agent.history.serve import Sampler

SD_LISTEN_FDS_START = 3  # systemd's socket activation passes the first socket as file descriptor 3


class ListenError(Exception):
    """The address cannot be listened on; one sentence."""


@dataclass(frozen=True)
class Endpoint:
    """What one ``serve`` HTTP server answers from: its sampler, and how old a good look may be for /healthz."""

    sampler: Sampler
    health_window_s: float


class _Handler(MetricsHandler):
    endpoint: Endpoint  # set on the subclass made for one server (handler_for)

    def do_GET(self) -> None:
        path = urlparse(self.path).path
        if path == "/metrics":
            self._metrics()
        elif path == "/healthz":
            self._healthz()
        elif path == "/":
            self._text(200, "kvforensics serve: /metrics (Prometheus), /healthz\n")
        else:
            self._text(404, "not found: kvforensics serves /metrics and /healthz\n")

    def _metrics(self) -> None:
        registry = self.endpoint.sampler.current()
        if registry is None:  # no look has succeeded yet: nothing true to say, and an empty 200 would hide it
            self._text(503, "no sample yet: {}\n".format(self.endpoint.sampler.health(0).message))
            return
        self.registry = registry  # this request's registry: prometheus-client's handler renders it
        super().do_GET()

    def _healthz(self) -> None:
        self.endpoint.sampler.current()  # a probe also samples when due: health does not wait for a scrape
        health = self.endpoint.sampler.health(self.endpoint.health_window_s)
        self._text(200 if health.healthy else 503, ("ok: " if health.healthy else "unhealthy: ") + health.message
                   + "\n")

    def _text(self, status: int, body: str) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a scrape cut off by shutdown does not hold the exit


def parse_listen(text: str) -> Tuple[str, int]:
    """``ADDR:PORT``, ``[IPv6]:PORT`` or a bare ``PORT`` (loopback); port 0 is any free port (the startup
    line names it). ``:PORT`` is refused: some tools read it as every interface, others as loopback;
    every interface must be written out (0.0.0.0, [::])."""
    text = text.strip()
    if text.isdigit():
        host, port = "127.0.0.1", text
    else:
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            raise ListenError("--listen takes ADDR:PORT (127.0.0.1:9842, [::1]:9842, 0.0.0.0:9842), not {!r}".format(
                text))
        if not host:
            raise ListenError("--listen {}: name the address: 127.0.0.1{} for this host only, 0.0.0.0{} or [::]{} "
                              "for every interface".format(text, text, text, text))
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
    if not 0 <= int(port) <= 65535:
        raise ListenError("--listen: the port must be 0–65535, not {}".format(port))
    return host, int(port)


def handler_for(endpoint: Endpoint) -> type:
    return type("Handler", (_Handler,), {"endpoint": endpoint})


def inherited_socket() -> Optional[socket.socket]:
    """The listening socket systemd (a .socket unit) or a supervisor passed, per sd_listen_fds(3):
    LISTEN_PID names this process and LISTEN_FDS is 1. The variables are removed so that no child
    takes the socket for its own."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or "LISTEN_FDS" not in os.environ:
        return None
    count = os.environ.get("LISTEN_FDS", "")
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    if count != "1":
        raise ListenError("socket activation passed {} sockets; kvforensics serve takes one".format(count))
    try:
        return socket.socket(fileno=SD_LISTEN_FDS_START)
    except OSError as exc:
        raise ListenError("the inherited socket (fd 3) is not usable: {}".format(exc.strerror or exc)) from None


def make_server(listen: str, endpoint: Endpoint) -> Server:
    """A server on the inherited socket when there is one, else bound to ``listen``."""
    handler = handler_for(endpoint)
    sock = inherited_socket()
    if sock is not None:
        server = Server(sock.getsockname()[:2], handler, bind_and_activate=False)
        server.socket.close()
        server.socket = sock
        return server
    host, port = parse_listen(listen)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except socket.gaierror as exc:
        raise ListenError("--listen {}: {}".format(listen, exc.strerror)) from None
    server_class = type("Server", (Server,), {"address_family": family})
    try:
        return server_class((host, port), handler)
    except OSError as exc:
        raise ListenError("--listen {}: {}".format(listen, exc.strerror or exc)) from None


def url(server: Server) -> str:
    host, port = server.socket.getsockname()[:2]
    return "http://{}:{}".format("[{}]".format(host) if ":" in host else host, port)
