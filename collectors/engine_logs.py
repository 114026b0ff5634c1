"""Find and read the engine's startup log: its stdout file, its systemd journal, or its container's.

Where an engine writes depends on how it was started:
* ``/proc/PID/fd/1`` is a regular file (``nohup … > server.log``): read that file from the end (in a
  container, the path is the container's: it is read through ``/proc/PID/root``).
* a systemd service: the unit's journal, *this invocation only* (``_SYSTEMD_INVOCATION_ID``),
  newest first, stopping at the startup's launch line (its plug-in's ``launch_lines``).
* a kubelet's container (containerd, CRI-O): its CRI log file under /var/log/pods, the current
  container's ``N.log`` and then its rotated files, newest first (collectors/pods.py).
* a docker or podman container: ``docker logs --tail`` / ``podman logs --tail``.
``--log PATH|journal:UNIT|docker:NAME|podman:NAME|k8s:NAMESPACE/POD[/CONTAINER]`` overrides. Commands
run with argument lists (never a shell), and unit/container/pod names are validated first: a value
starting with ``-`` could otherwise become an option, one holding ``/`` or ``..`` another path.

Output: ``{"status", "source", "lines": [[line, offset, raw], ...] (the chosen startup's
recognised lines), "index", "count", "index_from_end", "notes", "problems"}``. ``raw`` is the line
as the engine wrote it: a shipper's prefix removed and a CRI file's partial records joined
(collectors/shipping.py; journal and docker lines lose theirs in ``events.segment``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any, Dict, List, Optional, Tuple

from kvforensics.collectors import pods
from kvforensics.collectors.events import EngineStartup as Startup
from kvforensics.collectors.logfile import LogReadError, keywords_for, read_log
from kvforensics.collectors.plugin import ENGINES
from kvforensics.collectors.redact import redact_text

NAME = "engine_log"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9@_.:\-]{0,200}\Z")
COMMAND_TIMEOUT_S = 15
MAX_STREAM_LINES = 2_000_000  # bounds a journal or container log read backwards/forwards


def _display(engine: str) -> str:
    plugin = ENGINES.find(engine)
    return plugin.display if plugin is not None else " or ".join(e.display for e in ENGINES.all())


class LogSpecError(ValueError):
    """A --log value that is not PATH, journal:UNIT, docker:NAME, podman:NAME or k8s:NAMESPACE/POD[/CONTAINER]
    with safe names."""


_COMMAND_KINDS = ("journal", "docker", "podman")
K8S = "k8s"
CRI_DIR = "cri"  # a kubelet container's log folder, as found from its process (not a --log form)


def _parse_k8s(value: str) -> Tuple[str, str]:
    parts = value.split("/")
    if len(parts) not in (2, 3) or not pods.valid_reference(parts[0], parts[1], parts[2] if len(parts) == 3 else None):
        raise LogSpecError("--log k8s:NAMESPACE/POD[/CONTAINER] takes Kubernetes names (lowercase letters, digits, "
                           "- and, in a pod name, .), not {!r}".format(value))
    return K8S, value


def parse_spec(spec: str) -> Tuple[str, str]:
    """("file", path) | ("journal", unit) | ("docker"|"podman", name) | ("k8s", "namespace/pod[/container]");
    rejects unsafe names."""
    if spec.startswith(K8S + ":"):
        return _parse_k8s(spec[len(K8S) + 1:])
    for kind in _COMMAND_KINDS:
        if spec.startswith(kind + ":"):
            name = spec[len(kind) + 1:]
            if not _SAFE_NAME.match(name):
                raise LogSpecError("--log {}:NAME takes a unit or container name (letters, digits, @ _ . : -), "
                                   "not {!r}".format(kind, name))
            return kind, name
    if not spec:
        raise LogSpecError("--log needs a path, journal:UNIT, docker:NAME, podman:NAME or k8s:NAMESPACE/POD")
    return "file", spec


def _container_spec(pid: int, container: Dict[str, Any]) -> Tuple[Optional[Tuple[str, str]], Optional[str]]:
    """Where a container's stdout pipe ends: the kubelet's CRI log file (docker keeps its own, which
    ``docker logs`` reads), else the runtime's ``logs`` command."""
    runtime = container.get("runtime")
    pod = pods.from_container(container)
    if runtime in ("docker", "podman"):
        return (runtime, container["id"][:12]), None
    if pod is not None and pod.log_dir is not None:
        return (CRI_DIR, pod.log_dir), None
    if container.get("pod_uid"):
        return None, ("PID {} runs in pod {} but {} does not name its container's log: pass --log "
                      "k8s:NAMESPACE/POD/CONTAINER or the log file").format(pid, container["pod_uid"], pods.PODS_DIR)
    return None, "PID {} runs in a {} container ({}): pass --log".format(pid, runtime, container["id"][:12])


def spec_for(server: Optional[Dict[str, Any]]) -> Tuple[Optional[Tuple[str, str]], Optional[str]]:
    """Where a server process writes, or (None, reason)."""
    if server is None:
        return None, "no server process found (only its workers)"
    out = server.get("stdout") or ""
    container = server.get("container")
    if out.startswith("file:"):
        # a container's path is in its own mount namespace: the host reaches it through /proc/PID/root
        if container:
            return ("file", "/proc/{}/root{}".format(server["pid"], out[5:])), None
        return ("file", _own_file(server["pid"], out[5:])), None
    if out.startswith("deleted:"):
        return None, "the server's stdout file {} was deleted while it runs".format(out[8:])
    if server.get("unit"):
        return ("journal", server["unit"]), None
    if container and out != "null":  # a pipe to the runtime's shim, or a tty it records too
        return _container_spec(server["pid"], container)
    if not out:
        return None, ("cannot see where PID {} writes (its /proc/PID/fd is not readable: run as its user or "
                      "root)").format(server["pid"])
    return None, "PID {} writes to a {} and runs outside systemd and containers: pass --log".format(server["pid"], out)


def _own_file(pid: int, path: str) -> str:
    """The file the server writes: its path when that path names the same file here, else the server's own
    descriptor (``/proc/PID/fd/1``): a private /tmp (systemd's PrivateTmp=, on either side) or another mount
    namespace shows a different file or none at that path, and a log renamed by rotation is still the one
    the descriptor holds."""
    fd = "/proc/{}/fd/1".format(pid)
    try:
        mine = os.stat(fd)
    except OSError:
        return path  # not ours to read (another user's process): the path says why
    try:
        there = os.stat(path)
    except OSError:
        return fd
    return path if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino) else fd


def _lines_of(startup: Startup) -> List[List[Any]]:
    seen = set()
    out = []
    for ev in startup.events:
        key = (ev.line, ev.offset)
        if key in seen:
            continue
        seen.add(key)
        # the server_args line echoes --api-key: a snapshot or bundle must not carry it
        out.append([ev.line, ev.offset, redact_text(ev.raw)])
    return out


def _run(argv: List[str]) -> Tuple[Optional[subprocess.Popen], Optional[str]]:
    if shutil.which(argv[0]) is None:
        return None, "{} is not installed here".format(argv[0])
    try:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL), None
    except OSError as exc:
        return None, "cannot run {}: {}".format(argv[0], exc)


def _journal(unit: str, engine: str) -> Tuple[List[Startup], List[str]]:
    """This invocation's journal, newest first, until the startup's launch line."""
    notes: List[str] = []
    argv = ["journalctl", "--no-pager", "-o", "cat", "-r", "-u", unit]
    show, _ = _run(["systemctl", "show", "-p", "InvocationID", "--value", unit])
    if show is not None:
        try:
            out, _ = show.communicate(timeout=COMMAND_TIMEOUT_S)
            invocation = out.decode().strip()
            if re.match(r"^[0-9a-f]{32}$", invocation):
                argv.append("_SYSTEMD_INVOCATION_ID=" + invocation)
        except subprocess.TimeoutExpired:
            show.kill()
    proc, err = _run(argv)
    if proc is None:
        raise LogReadError("unreadable", "journal:{}: {}".format(unit, err))
    kept: List[Tuple[int, str]] = []
    count = 0
    keywords = keywords_for(engine)
    # The line that opens a launch stops a journal read newest first; an engine that prints none
    # (vLLM before 0.10) is bounded by the invocation alone.
    plugin = ENGINES.find(engine)
    launch = plugin.launch_lines if plugin is not None else tuple(n for e in ENGINES.all() for n in e.launch_lines)
    assert proc.stdout is not None
    for raw in proc.stdout:
        count += 1
        if any(k in raw for k in keywords):
            kept.append((count, raw.decode("utf-8", "replace").rstrip("\n")))
            if any(n in raw for n in launch):
                break
        if count >= MAX_STREAM_LINES:
            notes.append("stopped after {:,} journal lines without finding the startup's launch line".format(count))
            break
    proc.kill()
    proc.wait()
    if proc.returncode not in (0, -9, None) and not kept:
        raise LogReadError("unreadable",
                           "journal:{}: journalctl failed (are you in the systemd-journal group?)".format(unit))
    # Read newest first: renumber so line 1 is the oldest line read (the startup's server_args).
    lines = [(count - n + 1, count - n, raw) for n, raw in reversed(kept)]
    notes.append("journal:{}: line numbers count from the first journal line read (this invocation's "
                 "launch line)".format(unit))
    return _segment(engine, lines), notes


def _segment(engine: str, lines: List[Tuple[int, int, str]]) -> List[Startup]:
    """The engine's startups in the lines; "auto": the first engine's that finds any."""
    plugin = ENGINES.find(engine)
    if plugin is not None:
        return plugin.segment_lines(lines)
    for candidate in ENGINES.all():
        found = candidate.segment_lines(lines)
        if found:
            return found
    return []


def _container_logs(tool: str, name: str, engine: str) -> Tuple[List[Startup], List[str]]:
    """``docker logs`` or ``podman logs`` (the same command line and output)."""
    proc, err = _run([tool, "logs", "--tail", str(MAX_STREAM_LINES), name])
    if proc is None:
        raise LogReadError("unreadable", "{}:{}: {}".format(tool, name, err))
    assert proc.stdout is not None
    lines = []
    keywords = keywords_for(engine)
    for number, raw in enumerate(proc.stdout, 1):
        if any(k in raw for k in keywords):
            lines.append((number, 0, raw.decode("utf-8", "replace").rstrip("\n")))
    proc.wait()
    if proc.returncode and not lines:
        raise LogReadError("unreadable", "{}:{}: {} logs failed (exit {})".format(tool, name, tool, proc.returncode))
    return _segment(engine, lines), ["{} logs: line numbers count from the first of the last {:,} "
                                  "lines".format(tool, MAX_STREAM_LINES)]


def _pod_container(kind: str, name: str, root: str) -> pods.PodContainer:
    if kind == K8S:
        parts = name.split("/")
        try:
            return pods.find(root, parts[0], parts[1], parts[2] if len(parts) > 2 else None)
        except pods.PodLogError as exc:
            raise LogReadError("missing", "k8s:{}: {}".format(name, exc)) from None
    found = pods.parse_log_dir(name)
    if found is None:
        raise LogReadError("missing", "{}: not a kubelet container log folder".format(name))
    return found


def _no_startup(pod: pods.PodContainer, files: pods.LogFiles, first: LogReadError) -> LogReadError:
    """No startup in the current container's files: after a restart, the last one may be the previous
    container's (``kubectl logs --previous``), which is not the process running now."""
    hint = "" if files.previous is None else "; the previous container's log is {} (not the running process)".format(
        files.previous)
    return LogReadError(first.code, "{}: {} (read {}){}".format(pod.label, first.message, ", ".join(files.files), hint))


def _read_pod(pod: pods.PodContainer, root: str, startup: int, engine: str) -> Tuple[Any, List[str]]:
    """The current container's CRI log file, then its rotations newest first, until one holds the startup
    asked for (a long-running engine's startup may be rotated out of N.log)."""
    files = pods.log_files(root, pod.log_dir or "")
    if not files.files:
        raise LogReadError("missing", "{}: no log file in {}".format(pod.label, pod.log_dir))
    first: Optional[LogReadError] = None
    for path in files.files:
        try:
            excerpt = read_log(os.path.join(root, path.lstrip("/")), startup, engine=engine)
        except LogReadError as exc:
            if exc.code not in ("no_startup", "empty"):
                raise
            first = first or exc
            continue
        note = "{}: read {} (container restart {}{})".format(
            pod.label, path, files.restart, "" if path == files.files[0] else "; rotated out of the current file")
        return excerpt, [note] + list(excerpt.notes)
    assert first is not None
    raise _no_startup(pod, files, first)


def _from_stream(kind: str, name: str, startup: int, engine: str, source: str) -> Tuple[Startup, List[str]]:
    """The chosen startup of a journal or a container runtime's ``logs`` (read whole, then segmented)."""
    startups, notes = _journal(name, engine) if kind == "journal" else _container_logs(kind, name, engine)
    if not startups:
        raise LogReadError("no_startup", "{}: no {} startup lines found".format(source, _display(engine)))
    if abs(startup) > len(startups):
        raise LogReadError("usage", "{}: --startup {} does not exist; {} startup(s) read".format(
            source, startup, len(startups)))
    return (startups[startup] if startup < 0 else startups[startup - 1]), notes


def _read(section: Dict[str, Any], kind: str, name: str, startup: int, engine: str, root: str) -> Tuple[
        Startup, List[str]]:
    """The chosen startup and the reader's notes; fills the section's source and position."""
    if kind in (K8S, CRI_DIR):
        pod = _pod_container(kind, name, root)
        section["source"] = pod.label
        excerpt, notes = _read_pod(pod, root, startup, engine)
    elif kind == "file":
        excerpt = read_log(name, startup, engine=engine)
        notes = list(excerpt.notes)
    else:
        chosen, notes = _from_stream(kind, name, startup, engine, section["source"])
        section.update(index_from_end=-1 if startup == -1 else startup)
        return chosen, notes
    section.update(index=excerpt.index, count=excerpt.count, index_from_end=excerpt.index_from_end)
    return excerpt.startup, notes


def collect(spec: Optional[Tuple[str, str]], reason: Optional[str] = None, startup: int = -1,
            engine: str = "auto", root: str = "/") -> Dict[str, Any]:
    """``engine``: whose log it is (a registered engine's name: the server found; "auto": from the lines).
    ``root``: where the node's /var/log/pods is (``/``; a fixture tree in tests)."""
    section: Dict[str, Any] = {"status": "ok", "source": None, "lines": [], "index": None, "count": None,
                               "index_from_end": None, "engine": None, "notes": [], "problems": []}
    if spec is None:
        section["status"] = "absent"
        section["problems"].append({"code": "engine_log.not_found", "message": reason or "no log to read"})
        return section
    kind, name = spec
    section["source"] = "{}:{}".format(kind, name)
    try:
        chosen, notes = _read(section, kind, name, startup, engine, root)
    except LogReadError as exc:
        section["status"] = "failed"
        section["problems"].append({"code": "engine_log." + exc.code, "message": exc.message})
        return section
    section["lines"] = _lines_of(chosen)
    section["engine"] = chosen.engine
    section["notes"] = notes
    return section
