"""Find and read the engine's startup log: its stdout file, its systemd journal, or its container.

Where an engine writes depends on how it was started:
* ``/proc/PID/fd/1`` is a regular file (``nohup … > server.log``): read that file from the end.
* a systemd service: the unit's journal, *this invocation only* (``_SYSTEMD_INVOCATION_ID``),
  newest first, stopping at the startup's launch line (its plug-in's ``launch_lines``).
* a docker container: ``docker logs --tail``.
``--log PATH|journal:UNIT|docker:NAME`` overrides. Commands run with argument lists (never a
shell), and unit/container names are validated first: a value starting with ``-`` could
otherwise become an option.

Output: ``{"status", "source", "lines": [[line, offset, raw], ...] (the chosen startup's
recognised lines), "index", "count", "index_from_end", "notes", "problems"}``. ``raw`` is the line
as the engine wrote it: a shipper's prefix removed and a CRI file's partial records joined
(collectors/shipping.py; journal and docker lines lose theirs in ``events.segment``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any, Dict, List, Optional, Tuple

from collectors.events import EngineStartup as Startup
from collectors.logfile import LogReadError, keywords_for, read_log
from collectors.plugin import ENGINES
from collectors.redact import redact_text

NAME = "engine_log"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9@_.:\-]{0,200}$")
COMMAND_TIMEOUT_S = 15
MAX_STREAM_LINES = 2_000_000  # bounds a journal or container log read backwards/forwards


def _display(engine: str) -> str:
    plugin = ENGINES.find(engine)
    return plugin.display if plugin is not None else " or ".join(e.display for e in ENGINES.all())


class LogSpecError(ValueError):
    """A --log value that is not PATH, journal:UNIT or docker:NAME with a safe name."""


def parse_spec(spec: str) -> Tuple[str, str]:
    """("file", path) | ("journal", unit) | ("docker", name); rejects unsafe names."""
    for kind in ("journal", "docker"):
        if spec.startswith(kind + ":"):
            name = spec[len(kind) + 1:]
            if not _SAFE_NAME.match(name):
                raise LogSpecError("--log {}:NAME takes a unit or container name (letters, digits, @ _ . : -), "
                                   "not {!r}".format(kind, name))
            return kind, name
    if not spec:
        raise LogSpecError("--log needs a path, journal:UNIT or docker:NAME")
    return "file", spec


def spec_for(server: Optional[Dict[str, Any]]) -> Tuple[Optional[Tuple[str, str]], Optional[str]]:
    """Where a server process writes, or (None, reason)."""
    if server is None:
        return None, "no server process found (only its workers)"
    out = server.get("stdout") or ""
    if out.startswith("file:"):
        return ("file", out[5:]), None
    if out.startswith("deleted:"):
        return None, "the server's stdout file {} was deleted while it runs".format(out[8:])
    if server.get("unit"):
        return ("journal", server["unit"]), None
    container = server.get("container")
    if container and container.get("runtime") == "docker":
        return ("docker", container["id"][:12]), None
    if not out:
        return None, ("cannot see where PID {} writes (its /proc/PID/fd is not readable: run as its user or "
                      "root)").format(server["pid"])
    return None, "PID {} writes to a {} and runs outside systemd and docker: pass --log".format(server["pid"], out)


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


def _docker(name: str, engine: str) -> Tuple[List[Startup], List[str]]:
    proc, err = _run(["docker", "logs", "--tail", str(MAX_STREAM_LINES), name])
    if proc is None:
        raise LogReadError("unreadable", "docker:{}: {}".format(name, err))
    assert proc.stdout is not None
    lines = []
    keywords = keywords_for(engine)
    for number, raw in enumerate(proc.stdout, 1):
        if any(k in raw for k in keywords):
            lines.append((number, 0, raw.decode("utf-8", "replace").rstrip("\n")))
    proc.wait()
    if proc.returncode and not lines:
        raise LogReadError("unreadable", "docker:{}: docker logs failed (exit {})".format(name, proc.returncode))
    return _segment(engine, lines), ["docker logs: line numbers count from the first of the last {:,} "
                                  "lines".format(MAX_STREAM_LINES)]


def collect(spec: Optional[Tuple[str, str]], reason: Optional[str] = None, startup: int = -1,
            engine: str = "auto") -> Dict[str, Any]:
    """``engine``: whose log it is (a registered engine's name: the server found; "auto": from the lines)."""
    section: Dict[str, Any] = {"status": "ok", "source": None, "lines": [], "index": None, "count": None,
                               "index_from_end": None, "engine": None, "notes": [], "problems": []}
    if spec is None:
        section["status"] = "absent"
        section["problems"].append({"code": "engine_log.not_found", "message": reason or "no log to read"})
        return section
    kind, name = spec
    section["source"] = "{}:{}".format(kind, name)
    try:
        if kind == "file":
            excerpt = read_log(name, startup, engine=engine)
            chosen, notes = excerpt.startup, list(excerpt.notes)
            section.update(index=excerpt.index, count=excerpt.count, index_from_end=excerpt.index_from_end)
        else:
            startups, notes = _journal(name, engine) if kind == "journal" else _docker(name, engine)
            if not startups:
                raise LogReadError("no_startup", "{}: no {} startup lines found".format(
                    section["source"], _display(engine)))
            if abs(startup) > len(startups):
                raise LogReadError("usage", "{}: --startup {} does not exist; {} startup(s) read".format(
                    section["source"], startup, len(startups)))
            chosen = startups[startup] if startup < 0 else startups[startup - 1]
            section.update(index_from_end=-1 if startup == -1 else startup)
    except LogReadError as exc:
        section["status"] = "failed"
        section["problems"].append({"code": "engine_log." + exc.code, "message": exc.message})
        return section
    section["lines"] = _lines_of(chosen)
    section["engine"] = chosen.engine
    section["notes"] = notes
    return section
