"""Which engine a command explains or records (``--engine``): a port, a pod, or a pod and a port.

A port alone names a server on a bare-metal node. On a Kubernetes node several pods may run the same engine
on the same port, each in its own network namespace: ``NAMESPACE/POD`` (or ``NAMESPACE/POD:PORT`` for a pod
that runs two servers) names one of them, as the node's kubelet layout names the pod (collectors/pods.py).
A selector that names several servers is said to, never settled by a guess. Standard library only: the
probe parses the same text on the inspected host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

__all__ = ["EngineSelector", "SelectorError", "parse", "pod_of", "describe", "text"]

# Kubernetes' names: a namespace is a DNS-1123 label, a pod's name a DNS-1123 subdomain.
_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?\Z")
_POD = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")
FORMS = "a port (8000), NAMESPACE/POD or NAMESPACE/POD:PORT"


class SelectorError(ValueError):
    """An --engine value that names no server anywhere: a one-line message."""


@dataclass(frozen=True)
class EngineSelector:
    """``port``, ``namespace`` and ``pod``: each None when not asked for (a pod is always asked for with its
    namespace)."""

    port: Optional[int] = None
    namespace: Optional[str] = None
    pod: Optional[str] = None

    def matches(self, engine: Dict[str, Any], port: int) -> bool:
        """Whether the engine (a snapshot's engine entry, serving on ``port``) is one this selector names."""
        return self.names(port, pod_of(engine))

    def names(self, port: Optional[int], pod: Optional[Tuple[str, str]]) -> bool:
        """Whether a server on ``port`` in ``pod`` ((namespace, name), None outside a pod) is one this names."""
        return (self.port is None or port == self.port) and (self.pod is None or pod == (self.namespace, self.pod))

    def __str__(self) -> str:
        return text(self.port, (self.namespace, self.pod) if self.pod is not None else None)


def parse(value: Union[str, int]) -> EngineSelector:
    """``8000``, ``NAMESPACE/POD`` or ``NAMESPACE/POD:PORT``; SelectorError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return EngineSelector(port=_port(str(value), value))
    if not isinstance(value, str):
        raise SelectorError("--engine takes {}".format(FORMS))
    where, colon, port_text = value.rpartition(":") if ":" in value else (value, "", "")
    if not colon and _PORT.match(where):
        return EngineSelector(port=_port(where, value))
    namespace, slash, pod = where.partition("/")
    if not slash or not _NAMESPACE.match(namespace) or not _POD.match(pod):
        raise SelectorError("--engine takes {}, not {!r}".format(FORMS, value[:300]))
    return EngineSelector(port=_port(port_text, value) if colon else None, namespace=namespace, pod=pod)


def _port(text: str, value: object) -> int:
    port = int(text) if _PORT.match(text) else 0
    if not 1 <= port <= 65535:
        raise SelectorError("--engine takes the server's port, 1–65535, not {}".format(str(value)[:300]))
    return port


def pod_of(engine: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """(namespace, pod) of the engine's processes as the kubelet layout names them: its server's, else the first
    worker's that names one (they share a pod); None outside a pod, or where the layout does not say."""
    procs: List[Any] = ([engine.get("server")] + list(engine.get("schedulers") or [])
                        + list(engine.get("helpers") or []))
    for proc in procs:
        container = proc.get("container") if isinstance(proc, dict) else None
        if isinstance(container, dict) and container.get("namespace") and container.get("pod"):
            return str(container["namespace"]), str(container["pod"])
    return None


def text(port: Optional[int], pod: Optional[Tuple[str, str]]) -> str:
    """How --engine writes a port and a pod ((namespace, name)), either of them None: ``8000``,
    ``team-a/llama-0``, ``team-a/llama-0:8000``."""
    where = "{}/{}".format(*pod) if pod is not None else ""
    if port is None:
        return where
    return "{}:{}".format(where, port) if where else str(port)


def describe(engine: Dict[str, Any], port: int) -> str:
    """The --engine value that names this engine on its node: its pod and port in a pod, else its port."""
    return text(port, pod_of(engine))
