"""HTTP GET on loopback, bounded: what engine_http and each engine's HTTP reader share.

Only 127.0.0.1 is ever contacted, with a short timeout: a busy server must not stall a
diagnosis, and kvforensics never talks to other hosts from the probe.
"""

from __future__ import annotations

from typing import Optional

TIMEOUT_S = 0.5
READ_LIMIT = 4 << 20


def whole_lines(body: bytes) -> str:
    """The body as text; if the read limit cut it, without its last, partial line (a cut "123"
    must not read as "12")."""
    if len(body) >= READ_LIMIT:
        body = body[:body.rfind(b"\n") + 1]
    return body.decode("utf-8", "replace")


def get(url: str) -> Optional[bytes]:
    import urllib.error  # here, not at the top: only hosts running an engine pay for it
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:  # noqa: S310 - loopback only
            return resp.read(READ_LIMIT)
    except (urllib.error.URLError, OSError, ValueError):
        return None
