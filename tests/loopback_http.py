"""A test HTTP server on 127.0.0.1 (a free port), served from a thread for the length of a ``with``."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator, Type


@contextmanager
def serving(handler: Type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """Its port; shut down, closed and its thread joined when the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
