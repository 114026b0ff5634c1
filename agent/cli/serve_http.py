"""The HTTP side of ``kvforensics serve``: ``/metrics`` rendered as prometheus-client renders it (content
negotiation, OpenMetrics, gzip, ``name[]`` filters), ``/healthz``, and where the socket comes from.

A server as node_exporter is one, on one event loop (asyncio) and a small pool of worker threads:
* a connection costs a coroutine, not a thread: 2,000 trickling sockets cost no thread each; past
  MAX_CONNECTIONS still reading their request the oldest of them is closed to make room (a flood of idle
  sockets never shuts a scrape out); the listen backlog is node_exporter's (LISTEN_BACKLOG);
* a request's line and headers must arrive within READ_TIMEOUT_S and fit MAX_HEADER_BYTES (then the
  connection is closed, nothing kept); the response is written within WRITE_TIMEOUT_S; one request per
  connection (``Connection: close``);
* a request is answered by one of WORKERS threads; a scrape or a probe that arrives during a sample waits
  for it at most SAMPLE_WAIT_S (agent/history/serve.py ``Sampler.current``), then is answered from the last
  sample, and ``/healthz`` says the sample is late: a stuck collector never blocks either;
* any request gets an answer, never a traceback: an Accept header prometheus-client cannot encode is a 406,
  a client gone early is dropped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import socket
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

from kvforensics.agent.history.serve import Sampler

SD_LISTEN_FDS_START = 3  # systemd's socket activation passes the first socket as file descriptor 3
LISTEN_BACKLOG = 4096  # node_exporter's (Go's listen backlog: the kernel's somaxconn)
MAX_CONNECTIONS = 512  # still reading their request at once; past it the oldest is closed to make room
MAX_HEADER_BYTES = 64 << 10  # a request line and headers; node_exporter (Go) allows 1 MB
MAX_HEADERS = 100
READ_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 30.0
SAMPLE_WAIT_S = 8.0  # under Prometheus' default 10 s scrape timeout
WORKERS = 8
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 406: "Not Acceptable",
            500: "Internal Server Error", 503: "Service Unavailable"}


class ListenError(Exception):
    """The address cannot be listened on; one sentence."""


@dataclass(frozen=True)
class Endpoint:
    """What one ``serve`` HTTP server answers from: its sampler, and how old a good look may be for /healthz."""

    sampler: Sampler
    health_window_s: float


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    params: Dict[str, List[str]]
    headers: Dict[str, str]  # lower-case names


Response = Tuple[int, List[Tuple[str, str]], bytes]


def respond(endpoint: Endpoint, req: Request) -> Response:
    """The answer to one request (in a worker thread: a sample may be taken here)."""
    if req.method not in ("GET", "HEAD"):
        return _text(405, "kvforensics serve answers GET\n")
    if req.path == "/metrics":
        return _metrics(endpoint, req)
    if req.path == "/healthz":
        endpoint.sampler.current(SAMPLE_WAIT_S)  # a probe also samples when due: health does not wait for a scrape
        health = endpoint.sampler.health(endpoint.health_window_s)
        return _text(200 if health.healthy else 503, ("ok: " if health.healthy else "unhealthy: ") + health.message
                     + "\n")
    if req.path == "/":
        return _text(200, "kvforensics serve: /metrics (Prometheus), /healthz\n")
    return _text(404, "not found: kvforensics serves /metrics and /healthz\n")


def _metrics(endpoint: Endpoint, req: Request) -> Response:
    import gzip

    from prometheus_client.exposition import choose_encoder, gzip_accepted

    registry = endpoint.sampler.current(SAMPLE_WAIT_S)
    if registry is None:  # no look has succeeded yet: nothing true to say, and an empty 200 would hide it
        return _text(503, "no sample yet: {}\n".format(endpoint.sampler.health(0).message))
    # prometheus-client's own rendering, as its MetricsHandler and WSGI app do (exposition.py, 0.26): the
    # encoder the Accept header asks for, the name[] filter, gzip when accepted
    try:
        encoder, content_type = choose_encoder(req.headers.get("accept"))
        if "name[]" in req.params:
            registry = registry.restricted_registry(req.params["name[]"])
        body = encoder(registry)
    except Exception as exc:  # noqa: BLE001 - an Accept it cannot encode ("openmetrics-text; version=x")
        return _text(406, "cannot answer Accept {!r}: {}\n".format(req.headers.get("accept", "")[:200],
                                                                  str(exc)[:200] or type(exc).__name__))
    headers = [("Content-Type", content_type)]
    if gzip_accepted(req.headers.get("accept-encoding", "")):
        body = gzip.compress(body)
        headers.append(("Content-Encoding", "gzip"))
    return 200, headers, body


def _text(status: int, body: str) -> Response:
    return status, [("Content-Type", "text/plain; charset=utf-8")], body.encode("utf-8")


def parse_request(head: bytes) -> Optional[Request]:
    """A request line and headers (CRLF or LF), or None when they are not HTTP/1.x."""
    lines = head.decode("iso-8859-1").replace("\r\n", "\n").split("\n")
    words = lines[0].split()
    if len(words) != 3 or not words[2].startswith("HTTP/1."):
        return None
    headers: Dict[str, str] = {}
    for line in lines[1:MAX_HEADERS + 1]:
        name, sep, value = line.partition(":")
        if sep and name.strip():
            headers[name.strip().lower()] = value.strip()
    parts = urlsplit(words[1])
    return Request(words[0].upper(), parts.path, parse_qs(parts.query), headers)


class Server:
    """``kvforensics serve``'s HTTP server: ``serve_forever`` in one thread, ``shutdown`` from another."""

    def __init__(self, sock: socket.socket, endpoint: Endpoint) -> None:
        self.socket = sock
        self.endpoint = endpoint
        self._pool = _DaemonPool(WORKERS)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stop: Optional[asyncio.Event] = None
        self._stopped = threading.Event()
        self._waiting: "Dict[Any, None]" = {}  # connections still reading their request, in arrival order

    def serve_forever(self) -> None:
        try:
            asyncio.run(self._main())
        finally:
            self._stopped.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, sock=self.socket, backlog=LISTEN_BACKLOG,
                                            limit=MAX_HEADER_BYTES)
        async with server:
            await self._stop.wait()

    def shutdown(self) -> None:
        """Stop accepting and return once the loop ended (requests in flight are dropped, not waited for)."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._stopped.wait(timeout=10)
        self._pool.shutdown()

    def server_close(self) -> None:
        try:
            self.socket.close()
        except OSError:
            pass

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._waiting[task] = None  # still reading its request, oldest first
        if len(self._waiting) > MAX_CONNECTIONS:  # full: the oldest that has sent no whole request makes room,
            next(iter(self._waiting)).cancel()  # so a flood of idle sockets never shuts a scrape out
        try:
            await self._serve_one(reader, writer)
        except (ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                OSError, ValueError):
            pass  # a client gone early, too slow, or past the header limit: nothing to answer, nothing kept
        except asyncio.CancelledError:
            pass  # the server stops: a connection still waiting is dropped (re-raised, 3.11's streams log it)
        finally:
            self._waiting.pop(task, None)
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(_read_head(reader), READ_TIMEOUT_S)
        self._waiting.pop(asyncio.current_task(), None)  # a whole request: it is answered, not made room for
        req = parse_request(head)
        if req is None:
            status, headers, body = _text(400, "kvforensics serve speaks HTTP/1.x\n")
        else:
            try:
                status, headers, body = await asyncio.wrap_future(self._pool.submit(respond, self.endpoint, req))
            except Exception as exc:  # noqa: BLE001 - a bug answers 500 in a line, never a traceback
                status, headers, body = _text(500, "internal error: {}\n".format(type(exc).__name__))
        out = ["HTTP/1.1 {} {}".format(status, _REASONS.get(status, "")), "Content-Length: {}".format(len(body)),
               "Connection: close"] + ["{}: {}".format(k, v) for k, v in headers]
        writer.write("\r\n".join(out).encode("latin-1") + b"\r\n\r\n" + (b"" if req and req.method == "HEAD"
                                                                            else body))
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)


class _DaemonPool:
    """WORKERS daemon threads answering requests: one stuck in a collector (a sample that never ends) must not
    hold the process at exit, as concurrent.futures' own workers would (they are joined at exit)."""

    def __init__(self, workers: int) -> None:
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._workers = workers
        for i in range(workers):
            threading.Thread(target=self._work, name="kvf-serve-{}".format(i), daemon=True).start()

    def submit(self, fn: Any, *args: Any) -> "concurrent.futures.Future[Any]":
        future: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        self._queue.put((future, fn, args))
        return future

    def shutdown(self) -> None:
        for _ in range(self._workers):
            self._queue.put(None)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the request's coroutine
                future.set_exception(exc)


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    """The request line and headers, up to the blank line (CRLF or LF alone); the reader's limit bounds them."""
    data = b""
    while True:
        line = await reader.readuntil(b"\n")
        if line in (b"\r\n", b"\n"):
            return data
        data += line
        if len(data) > MAX_HEADER_BYTES:
            raise ValueError("headers over the limit")


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
    sock = inherited_socket()
    if sock is not None:
        return Server(sock, endpoint)
    host, port = parse_listen(listen)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except socket.gaierror as exc:
        raise ListenError("--listen {}: {}".format(listen, exc.strerror)) from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise ListenError("--listen {}: {}".format(listen, exc.strerror or exc)) from None
    return Server(sock, endpoint)


def url(server: Server) -> str:
    host, port = server.socket.getsockname()[:2]
    return "http://{}:{}".format("[{}]".format(host) if ":" in host else host, port)
