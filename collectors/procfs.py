"""The process table from /proc: command lines, parents, owners, start times, cgroups, stdout.

Pure parsers (``parse_*``) take file contents; ``process(root, pid)`` reads them under ``root``
(``/`` in production, a fixture tree in tests). A process that vanishes mid-read is skipped;
what cannot be read (another user's fds under ``hidepid``) is None with a reason.

Each process: ``{"pid", "ppid", "uid", "user", "cmdline": [...], "start_time_s", "cgroup",
"container": {"runtime", "id"[, "pod_uid", "qos", "namespace", "pod", "name"]} | None, "unit", "stdout"}``
(``runtime``: docker, containerd, cri-o, podman, or cri when only the kubelet's cgroup shape says a CRI
runtime runs it; a kubelet's container also has its pod's UID and QoS class, and the namespace, pod
and container names when /var/log/pods and /var/log/containers name them), where ``stdout`` is ``"file:/path"``,
``"pipe"``, ``"socket"``, ``"tty"``, ``"null"``, or None (not readable).
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

_HEX64 = r"[0-9a-f]{64}"
# Each runtime's own cgroup name for a container: "<prefix>-<id>.scope" under the systemd driver,
# "/docker/<id>", "/crio-<id>" or "/libpod-<id>" under cgroupfs. The id must follow the prefix: conmon's
# own scope ("crio-conmon-<id>", "libpod-conmon-<id>") is the monitor's, not the container's.
_RUNTIMES = (
    (re.compile(r"cri-containerd-(" + _HEX64 + r")"), "containerd"),
    (re.compile(r"crio-(" + _HEX64 + r")"), "cri-o"),
    (re.compile(r"libpod-(" + _HEX64 + r")"), "podman"),
    (re.compile(r"(?:/docker/|docker-)(" + _HEX64 + r")"), "docker"),
    (re.compile(r"(?:nerdctl|containerd)-(" + _HEX64 + r")"), "containerd"),
)
# A kubelet's pod cgroup: cgroupfs "kubepods/burstable/pod<uid>" (guaranteed pods sit directly under
# kubepods), systemd "kubepods-burstable-pod<uid with _ for ->.slice"; kind and others put a prefix
# before "kubepods". A static pod's UID is a 32-hex hash, not a UUID.
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_POD = re.compile(r"kubepods[-/](?:(burstable|besteffort)[-/])?pod(" + _UID + r")(?:\.slice)?(?=/|$)")
# Under cgroupfs, containerd names the container's cgroup by its bare id, below the pod's.
_BARE_ID = re.compile(r"^/(" + _HEX64 + r")(?:/|$)")
_UNIT = re.compile(r"/([^/]+\.service)(?:/|$)")
# A CRI runtime that names no runtime in the cgroup (containerd under cgroupfs), until the container's
# shim says which (``process``).
UNNAMED_CRI = "cri"
_SHIM_DEPTH = 16


def parse_cmdline(raw: bytes) -> List[str]:
    """NUL-separated argv. setproctitle titles ("sglang::scheduler_TP3") may be space padded."""
    parts = [p.decode("utf-8", "replace") for p in raw.split(b"\0")]
    while parts and parts[-1] == "":
        parts.pop()
    if len(parts) == 1 and " " in parts[0].strip():
        parts = parts[0].split()
    return [p.strip() for p in parts]


def parse_stat(text: str) -> Tuple[Optional[int], Optional[int]]:
    """(ppid, start time in clock ticks since boot) from /proc/PID/stat; comm may hold ')'."""
    tail = text.rsplit(")", 1)[-1].split()
    try:
        return int(tail[1]), int(tail[19])
    except (IndexError, ValueError):
        return None, None


def parse_uid(status: str) -> Optional[int]:
    for line in status.splitlines():
        if line.startswith("Uid:"):
            parts = line.split()
            return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return None


def _runtime_id(path: str) -> Optional[Tuple[str, str]]:
    for pattern, runtime in _RUNTIMES:
        m = pattern.search(path)
        if m:
            return runtime, m.group(1)
    return None


def _kubelet_container(path: str, pod: "re.Match[str]") -> Dict[str, str]:
    """A container below a kubelet's pod cgroup: its runtime and id (from what follows the pod's
    cgroup), the pod's UID (systemd writes its dashes as _) and QoS class."""
    uid = pod.group(2).replace("_", "-")
    rest = path[pod.end():]
    found = _runtime_id(rest)
    if found is None:
        bare = _BARE_ID.match(rest)
        found = (UNNAMED_CRI, bare.group(1)) if bare else ("kubernetes", uid)  # the pod's own cgroup
    return {"runtime": found[0], "id": found[1], "pod_uid": uid, "qos": pod.group(1) or "guaranteed"}


def parse_container(paths: List[str]) -> Optional[Dict[str, str]]:
    """The container a process runs in, from its cgroup paths: ``{"runtime", "id"}`` plus, below a
    kubelet's pod, ``"pod_uid"`` and ``"qos"``. A pod found in any hierarchy wins (a hybrid host may
    name it only in its v1 lines)."""
    for path in paths:
        pod = _POD.search(path)
        if pod:
            return _kubelet_container(path, pod)
    for path in paths:
        found = _runtime_id(path)
        if found:
            return {"runtime": found[0], "id": found[1]}
    return None


def parse_cgroup(text: str) -> Tuple[Optional[str], Optional[Dict[str, str]], Optional[str]]:
    """(cgroup path, container, systemd unit) from /proc/PID/cgroup.

    Every hierarchy line is searched: on hybrid v1/v2 hosts the container id may be only in a
    v1 line (``12:memory:/docker/<id>``) while the v2 line reads ``0::/``.
    """
    paths = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths.append((parts[0] == "0", parts[2]))
    if not paths:
        return None, None, None
    path = next((p for v2, p in paths if v2 and p != "/"), paths[0][1])
    container = parse_container([p for _, p in paths])
    unit = None
    if container is None:
        m = _UNIT.search("\n".join(p for _, p in paths))
        unit = m.group(1) if m else None
    return path, container, unit


def shim_runtime(argv: List[str]) -> Optional[str]:
    """The runtime a container shim's command line names: containerd's shim (docker's runs in
    containerd's "moby" namespace) or conmon (CRI-O's monitor, below a kubelet's pod)."""
    name = os.path.basename(argv[0]) if argv else ""
    if name.startswith("containerd-shim"):
        namespace = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-namespace", "--namespace")), None)
        return "docker" if namespace == "moby" else "containerd"
    if name == "conmon":
        return "cri-o"
    return None


def _runtime_from_shim(root: str, pid: int, container_id: str) -> Optional[str]:
    """Walk up from a process to the first ancestor outside its container's cgroup: the runtime's
    shim, which started the container."""
    for _ in range(_SHIM_DEPTH):
        stat = _read_bytes(os.path.join(root, "proc", str(pid), "stat"))
        ppid = parse_stat(stat.decode("utf-8", "replace"))[0] if stat else None
        if not ppid:
            return None
        cgroup = _read_bytes(os.path.join(root, "proc", str(ppid), "cgroup"))
        if cgroup is None:
            return None
        if container_id.encode() not in cgroup:
            return shim_runtime(cmdline(root, ppid) or [])
        pid = ppid
    return None


def _container(root: str, pid: int, container: Optional[Dict[str, str]]) -> Optional[Dict[str, Any]]:
    """The cgroup's container, its runtime named by its shim when the cgroup does not, and its pod's
    names from the node's log layout (collectors/pods.py)."""
    if container is None:
        return None
    if container["runtime"] == UNNAMED_CRI:
        container = dict(container, runtime=_runtime_from_shim(root, pid, container["id"]) or UNNAMED_CRI)
    # Here, not at the top: every host's probe walks /proc, and most of their processes are in no container;
    # pods (its regexes, its records) is compiled from source on the host only where one is.
    from kvforensics.collectors import pods

    return pods.describe(root, container)


def _read_bytes(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stdout_kind(root: str, pid: int) -> Optional[str]:
    try:
        target = os.readlink(os.path.join(root, "proc", str(pid), "fd", "1"))
    except OSError:
        return None  # another user's process, or gone
    if target.startswith("pipe:"):
        return "pipe"
    if target.startswith("socket:"):
        return "socket"
    if target == "/dev/null":
        return "null"
    if target.startswith("/dev/pts") or target.startswith("/dev/tty"):
        return "tty"
    if target.endswith(" (deleted)"):
        return "deleted:" + target[: -len(" (deleted)")]
    return "file:" + target


def user_name(uid: Optional[int], root: str = "/") -> Optional[str]:
    if uid is None:
        return None
    text = _read_bytes(os.path.join(root, "etc", "passwd"))
    for line in (text or b"").decode("utf-8", "replace").splitlines():
        parts = line.split(":")
        if len(parts) > 2 and parts[2] == str(uid):
            return parts[0]
    return str(uid)


def pids(root: str = "/") -> Iterator[int]:
    try:
        names = os.listdir(os.path.join(root, "proc"))
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def cmdline(root: str, pid: int) -> Optional[List[str]]:
    raw = _read_bytes(os.path.join(root, "proc", str(pid), "cmdline"))
    return None if raw is None else parse_cmdline(raw)


def process(root: str, pid: int, argv: Optional[List[str]] = None) -> Optional[Dict[str, Any]]:
    """Everything kvforensics needs about one process, or None if it is gone."""
    base = os.path.join(root, "proc", str(pid))
    stat = _read_bytes(os.path.join(base, "stat"))
    if stat is None:
        return None
    ppid, ticks = parse_stat(stat.decode("utf-8", "replace"))
    status = (_read_bytes(os.path.join(base, "status")) or b"").decode("utf-8", "replace")
    uid = parse_uid(status)
    cgroup, container, unit = parse_cgroup((_read_bytes(os.path.join(base, "cgroup")) or b"").decode("utf-8",
                                                                                                     "replace"))
    container = _container(root, pid, container)
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return {
        "pid": pid,
        "ppid": ppid,
        "uid": uid,
        "user": user_name(uid, root),
        "cmdline": argv if argv is not None else (cmdline(root, pid) or []),
        "start_time_s": None if ticks is None else ticks / hz,
        "cgroup": cgroup,
        "container": container,
        "unit": unit,
        "stdout": _stdout_kind(root, pid),
    }


# The initial PID namespace's inode (PROC_PID_INIT_INO, include/linux/proc_ns.h): NVML reports PIDs
# as that namespace numbers them.
INIT_PID_NS = "pid:[4026531836]"


def pid_namespace(root: str = "/") -> Optional[str]:
    """This process's PID namespace ("pid:[4026531836]" on the host), or None if unreadable."""
    try:
        return os.readlink(os.path.join(root, "proc", "self", "ns", "pid"))
    except OSError:
        return None


def parse_nspid(status: str) -> List[int]:
    """The ``NSpid:`` line: the PID in this /proc's namespace, then in each nested one inward."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return [int(x) for x in line.split()[1:] if x.isdigit()]
    return []


def nspid_index(root: str = "/") -> Dict[int, int]:
    """Inner-namespace PID → the PID this /proc shows, for processes living in nested namespaces
    (a container's engine seen from the host): how a PID numbered inside them is found here."""
    out: Dict[int, int] = {}
    for pid in pids(root):
        raw = _read_bytes(os.path.join(root, "proc", str(pid), "status"))
        if raw is None:
            continue
        levels = parse_nspid(raw.decode("utf-8", "replace"))
        for inner in levels[1:]:
            out.setdefault(inner, pid)
    return out


def exists(root: str, pid: int) -> bool:
    return os.path.exists(os.path.join(root, "proc", str(pid)))
