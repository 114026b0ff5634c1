"""The process table from /proc: command lines, parents, owners, start times, cgroups, stdout.

Pure parsers (``parse_*``) take file contents; ``process(root, pid)`` reads them under ``root``
(``/`` in production, a fixture tree in tests). A process that vanishes mid-read is skipped;
what cannot be read (another user's fds under ``hidepid``) is None with a reason.

Each process: ``{"pid", "ppid", "uid", "user", "cmdline": [...], "start_time_s", "cgroup",
"container": {"runtime", "id"} | None, "unit", "stdout"}`` where ``stdout`` is ``"file:/path"``,
``"pipe"``, ``"socket"``, ``"tty"``, ``"null"``, or None (not readable).
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

_DOCKER = re.compile(r"(?:docker[-/]|/docker/)([0-9a-f]{64})")
_CONTAINERD = re.compile(r"(?:cri-containerd-|crio-|containerd-)([0-9a-f]{64})")
_POD = re.compile(r"pod([0-9a-f_-]{36})")
_UNIT = re.compile(r"/([^/]+\.service)(?:/|$)")


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


def parse_cgroup(text: str) -> Tuple[Optional[str], Optional[Dict[str, str]], Optional[str]]:
    """(cgroup path, container {"runtime", "id"}, systemd unit) from /proc/PID/cgroup.

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
    joined = "\n".join(p for _, p in paths)
    container = None
    m = _POD.search(joined)
    if m:
        container = {"runtime": "kubernetes", "id": m.group(1).replace("_", "-")}
    else:
        for pattern, runtime in ((_DOCKER, "docker"), (_CONTAINERD, "containerd")):
            m = pattern.search(joined)
            if m:
                container = {"runtime": runtime, "id": m.group(1)}
                break
    unit = None
    if container is None:
        m = _UNIT.search(joined)
        unit = m.group(1) if m else None
    return path, container, unit


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
