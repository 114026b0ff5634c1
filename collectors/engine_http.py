"""The engine's own HTTP view (optional): what its server says of itself, on loopback only.

Each engine reads its own endpoints (``collectors/<engine>/http.py``, its plug-in's ``read_http``):
server info, resolved arguments, ``/metrics``. Only 127.0.0.1 is ever contacted, with a short
timeout (collectors/loopback.py).

Output: ``{"status", "url", "server_info": {...}|None, "metrics": {name: value},
"cache_config": {label: value}|None, "problems"}``.
"""

from __future__ import annotations

from typing import Any, Dict

from collectors.loopback import TIMEOUT_S, whole_lines
from collectors.plugin import ENGINES

__all__ = ["NAME", "TIMEOUT_S", "collect", "whole_lines"]

NAME = "engine_http"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "::", None)


def collect(server_args: Dict[str, Any], engine: str) -> Dict[str, Any]:
    """The engine_http section for a server of the engine named ``engine``."""
    plugin = ENGINES.find(engine)
    if plugin is None:
        raise ValueError("engine_http knows {}, not {!r}".format(", ".join(ENGINES.names()), engine))
    section: Dict[str, Any] = {"status": "absent", "url": None, "server_info": None, "metrics": {},
                               "cache_config": None, "problems": []}
    host = server_args.get("host")
    if host not in LOOPBACK_HOSTS and not str(host).startswith("127."):
        section["problems"].append({"code": "engine_http.not_loopback",
                                    "message": "the server listens on {}; only loopback is queried".format(host)})
        return section
    port = server_args.get("port", plugin.default_port)
    if not isinstance(port, int) or not 0 < port < 65536:
        return section
    base = "http://127.0.0.1:{}".format(port)
    section["url"] = base
    answered = plugin.read_http(base, section)
    if section["status"] == "absent" and not answered:
        section["problems"].append({"code": "engine_http.unreachable",
                                    "message": "no answer from {} within {} s".format(base, TIMEOUT_S)})
    return section
