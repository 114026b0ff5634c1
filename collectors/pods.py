"""Kubernetes pods as the kubelet lays them out on a node: which pod and container a container id is,
and which files hold its log. Read from the node's own files, never from an API server: the probe
runs on nodes where it has no credentials, and the answer must not depend on the control plane.

The kubelet has the runtime (containerd, CRI-O) write each container's stdout and stderr to
``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<N>.log`` (CRI records), N the container's restart
count, so after a restart the previous container's file is the lower N. It rotates a file to
``<N>.log.<YYYYMMDD-hhmmss>`` (gzipping all but the newest rotation) and links
``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log`` to the current one. Kubernetes
names cannot hold ``_`` (DNS-1123 labels and subdomains), so both names split on it unambiguously.

Paths are read under ``root`` (``/`` in production, a fixture tree in tests); the paths returned are
the node's own (without ``root``), as a person would type them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

PODS_DIR = "/var/log/pods"
CONTAINERS_DIR = "/var/log/containers"

# What Kubernetes accepts (apimachinery validation): a namespace and a container name are DNS-1123
# labels, a pod name a DNS-1123 subdomain. Validating --log k8s:… against them also keeps any path
# separator, glob character or leading "-" out of the paths built from them.
_LABEL = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?\Z")
_SUBDOMAIN = re.compile(r"^[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?\Z")
_LINK = re.compile(r"^([a-z0-9.-]+)_([a-z0-9-]+)_([a-z0-9-]+)-([0-9a-f]{64})\.log\Z")
# A pod UID is a UUID; a static pod's is the 32-hex hash of its manifest.
_POD_DIR = re.compile(r"^([a-z0-9-]+)_([a-z0-9.-]+)_([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
                      r"|[0-9a-f]{32})\Z")
_CURRENT = re.compile(r"^([0-9]{1,9})\.log\Z")
_ROTATED = re.compile(r"^([0-9]{1,9})\.log\.([0-9]{8}-[0-9]{6})(\.gz)?\Z")


class PodLogError(LookupError):
    """No log directory for the pod and container asked for; one sentence."""


@dataclass(frozen=True)
class PodContainer:
    """One container of one pod, as the node's log layout names it."""

    namespace: str
    pod: str
    uid: str
    container: Optional[str]  # None when the pod's log folder holds several and nothing says which

    @property
    def log_dir(self) -> Optional[str]:
        if self.container is None:
            return None
        return "{}/{}_{}_{}/{}".format(PODS_DIR, self.namespace, self.pod, self.uid, self.container)

    @property
    def label(self) -> str:
        """How --log names it: ``k8s:NAMESPACE/POD/CONTAINER``."""
        return "k8s:" + "/".join(x for x in (self.namespace, self.pod, self.container) if x)


def valid_reference(namespace: str, pod: str, container: Optional[str]) -> bool:
    return bool(_LABEL.match(namespace) and _SUBDOMAIN.match(pod) and (container is None or _LABEL.match(container)))


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _listdir(path: str) -> List[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _parse_pod_dir(name: str) -> Optional[Tuple[str, str, str]]:
    m = _POD_DIR.match(name)
    return (m.group(1), m.group(2), m.group(3)) if m else None


def _from_link(root: str, container_id: str, pod_uid: Optional[str]) -> Optional[PodContainer]:
    """The kubelet's ``/var/log/containers`` link for this container id, checked against the folder it
    points to (the pod UID there must be the cgroup's)."""
    for name in _listdir(_under(root, CONTAINERS_DIR)):
        m = _LINK.match(name)
        if not m or m.group(4) != container_id:
            continue
        try:
            target = os.readlink(_under(root, CONTAINERS_DIR + "/" + name))
        except OSError:
            continue
        parts = target.replace("\\", "/").rstrip("/").split("/")
        folder = _parse_pod_dir(parts[-3]) if len(parts) >= 3 else None
        if folder is None or (pod_uid is not None and folder[2] != pod_uid):
            continue
        return PodContainer(namespace=m.group(2), pod=m.group(1), uid=folder[2], container=m.group(3))
    return None


def _from_pod_dir(root: str, pod_uid: str) -> Optional[PodContainer]:
    """Without the link (a runtime that makes none, a log directory cleaned up): the pod's folder names
    the pod; its container only when it logs one container."""
    for name in _listdir(_under(root, PODS_DIR)):
        parsed = _parse_pod_dir(name)
        if parsed is None or parsed[2] != pod_uid:
            continue
        containers = [c for c in _listdir(_under(root, PODS_DIR + "/" + name)) if _LABEL.match(c)]
        return PodContainer(namespace=parsed[0], pod=parsed[1], uid=pod_uid,
                            container=containers[0] if len(containers) == 1 else None)
    return None


def identify(root: str, container_id: Optional[str], pod_uid: Optional[str]) -> Optional[PodContainer]:
    """The pod and container a container id (and its cgroup's pod UID) belongs to, or None."""
    found = _from_link(root, container_id, pod_uid) if container_id else None
    if found is None and pod_uid:
        found = _from_pod_dir(root, pod_uid)
    return found


def describe(root: str, container: Dict[str, Any]) -> Dict[str, Any]:
    """A process's ``container`` with ``namespace``, ``pod`` and ``name`` added when the node's log layout
    names them (a kubelet's container); unchanged otherwise."""
    uid = container.get("pod_uid")
    if not uid:
        return container
    cid = container.get("id") if container.get("id") != uid else None
    found = identify(root, cid, uid)
    if found is None:
        return container
    out = dict(container, namespace=found.namespace, pod=found.pod)
    if found.container is not None:
        out["name"] = found.container
    return out


def from_container(container: Optional[Dict[str, Any]]) -> Optional[PodContainer]:
    """The pod a process's ``container`` (as ``describe`` left it) names, or None."""
    if not container or not container.get("pod_uid") or not container.get("namespace") or not container.get("pod"):
        return None
    return PodContainer(namespace=container["namespace"], pod=container["pod"], uid=container["pod_uid"],
                        container=container.get("name"))


def _only_container(root: str, namespace: str, pod: str, uid: str) -> str:
    names = [c for c in _listdir(_under(root, "{}/{}_{}_{}".format(PODS_DIR, namespace, pod, uid))) if _LABEL.match(c)]
    if len(names) != 1:
        raise PodLogError("pod {}/{} logs {} containers ({}): name one, k8s:{}/{}/CONTAINER".format(
            namespace, pod, len(names), ", ".join(names) or "none", namespace, pod))
    return names[0]


def find(root: str, namespace: str, pod: str, container: Optional[str] = None) -> PodContainer:
    """The pod and container ``--log k8s:NAMESPACE/POD[/CONTAINER]`` names. A pod recreated under the same
    name (a StatefulSet's) may leave its old folder for a while: the one written last is taken."""
    if not valid_reference(namespace, pod, container):
        raise PodLogError("not a Kubernetes namespace/pod/container name: {!r}".format(
            "/".join(x for x in (namespace, pod, container) if x)))
    folders = []
    for name in _listdir(_under(root, PODS_DIR)):
        parsed = _parse_pod_dir(name)
        if parsed is not None and parsed[:2] == (namespace, pod):
            folders.append((_newest_mtime(_under(root, PODS_DIR + "/" + name)), parsed[2]))
    if not folders:
        raise PodLogError("no log folder {}/{}_{}_<uid> on this node (is the pod scheduled here?)".format(
            PODS_DIR, namespace, pod))
    uid = max(folders)[1]
    found = PodContainer(namespace=namespace, pod=pod, uid=uid,
                         container=container or _only_container(root, namespace, pod, uid))
    if not os.path.isdir(_under(root, found.log_dir or "")):
        raise PodLogError("pod {}/{} has no container {!r} logging on this node".format(namespace, pod, container))
    return found


def _newest_mtime(path: str) -> float:
    try:
        return max([os.stat(os.path.join(path, c)).st_mtime for c in os.listdir(path)] + [os.stat(path).st_mtime])
    except OSError:
        return 0.0


@dataclass(frozen=True)
class LogFiles:
    """A container's log files, the ones to read first first."""

    restart: Optional[int]  # N of the current container's N.log
    files: Tuple[str, ...]  # the node's paths: N.log, then its rotations newest first
    previous: Optional[str]  # the previous container's (N-1) current file, when kept


def log_files(root: str, log_dir: str) -> LogFiles:
    """The current container's file (the highest N: restarts count up) and its rotations, newest first."""
    current: Dict[int, str] = {}
    rotated: Dict[int, List[Tuple[str, str]]] = {}
    for name in _listdir(_under(root, log_dir)):
        m = _CURRENT.match(name)
        if m:
            current[int(m.group(1))] = name
            continue
        m = _ROTATED.match(name)
        if m:
            rotated.setdefault(int(m.group(1)), []).append((m.group(2), name))
    restarts = sorted(set(current) | set(rotated))
    if not restarts:
        return LogFiles(restart=None, files=(), previous=None)
    n = restarts[-1]
    names = ([current[n]] if n in current else []) + [name for _, name in sorted(rotated.get(n, []), reverse=True)]
    earlier = [r for r in restarts if r < n and r in current]
    return LogFiles(restart=n, files=tuple("{}/{}".format(log_dir, x) for x in names),
                    previous="{}/{}".format(log_dir, current[earlier[-1]]) if earlier else None)


def parse_log_dir(log_dir: str) -> Optional[PodContainer]:
    """The pod and container a container's log folder (``/var/log/pods/<ns>_<pod>_<uid>/<container>``) is."""
    parts = log_dir.rstrip("/").split("/")
    folder = _parse_pod_dir(parts[-2]) if len(parts) >= 2 else None
    if folder is None or not _LABEL.match(parts[-1]) or "/".join(parts[:-2]) != PODS_DIR:
        return None
    return PodContainer(namespace=folder[0], pod=folder[1], uid=folder[2], container=parts[-1])
