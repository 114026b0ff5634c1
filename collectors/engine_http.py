"""The engine's own HTTP view (optional): what its server says of itself, on loopback only.

Each engine reads its own endpoints (``collectors/<engine>/http.py``, its plug-in's ``read_http``):
server info, resolved arguments, ``/metrics``. Only 127.0.0.1 is ever contacted, with a short
timeout (collectors/loopback.py): the host's, or, when the server runs in a network namespace of its
own (a pod, a container), that namespace's, entered for the requests (collectors/netns.py).

Output: ``{"status", "url", "network_namespace": "net:[inode]"|None (the server's, when not this
one's), "server_info": {...}|None, "metrics": {name: value}, "cache_config": {label: value}|None,
"problems"}``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from kvforensics.collectors import netns
from kvforensics.collectors.loopback import TIMEOUT_S, whole_lines
from kvforensics.collectors.plugin import ENGINES

__all__ = ["NAME", "TIMEOUT_S", "collect", "whole_lines"]

NAME = "engine_http"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "::", None)


def _ask(plugin: Any, base: str, section: Dict[str, Any], pid: Optional[int], root: str) -> bool:
    """The engine's reader, in the server's network namespace when that is not this one's. One it cannot
    enter is not asked at all: this namespace's loopback may be another pod's engine on the same port."""
    namespace = netns.foreign_namespace(root, pid) if pid is not None else None
    if namespace is None:
        return plugin.read_http(base, section)
    section["network_namespace"] = namespace
    try:
        return netns.call_in(root, pid, lambda: plugin.read_http(base, section))
    except netns.NamespaceError as exc:
        section["problems"].append({"code": "engine_http.other_namespace", "message": (
            "the server (PID {}) listens in its own network namespace {}, which kvforensics cannot enter ({}; "
            "run as root)").format(pid, namespace, exc)})
        return True  # said why: not "unreachable"


def collect(server_args: Dict[str, Any], engine: str, pid: Optional[int] = None, root: str = "/") -> Dict[str, Any]:
    """The engine_http section for a server of the engine named ``engine``; ``pid``: its server process,
    whose network namespace is the one asked."""
    plugin = ENGINES.find(engine)
    if plugin is None:
        raise ValueError("engine_http knows {}, not {!r}".format(", ".join(ENGINES.names()), engine))
    section: Dict[str, Any] = {"status": "absent", "url": None, "network_namespace": None, "server_info": None,
                               "metrics": {}, "cache_config": None, "problems": []}
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
    answered = _ask(plugin, base, section, pid, root)
    if section["status"] == "absent" and not answered:
        where = " in {}".format(section["network_namespace"]) if section["network_namespace"] else ""
        section["problems"].append({"code": "engine_http.unreachable",
                                    "message": "no answer from {}{} within {} s".format(base, where, TIMEOUT_S)})
    return section
