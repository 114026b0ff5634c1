"""Inference servers on this node: each server process, its workers (one per GPU rank), helpers, flags.

Engine-neutral: each engine's plug-in (``collectors/<engine>/plugin.py``: ``classify``,
``parse_flags``) says which command lines are its servers, workers and helpers and how its flags read; this
module walks /proc once and groups the processes under their server by the parent-PID chain.
Processes are recognised by their command line, not the 15-character ``comm`` (setproctitle
titles are longer).

Output: ``{"status", "engines": [{"kind": engine name, "server": process|None, "schedulers":
[process + "rank"] (the GPU workers: SGLang's schedulers, vLLM's engine cores and workers),
"helpers": [process], "server_args": {...}, "launch": …}], "problems": [...]}`` (process dicts
from ``collectors/procfs.py``). The ``schedulers`` key keeps its first name so that bundles
written before vLLM was supported still read.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from kvforensics.collectors import procfs
from kvforensics.collectors.plugin import ENGINES, for_bundle
from kvforensics.collectors.redact import redact_argv, redact_mapping

NAME = "engines"
_ANCESTRY_DEPTH = 8


def classify(argv: List[str]) -> Optional[Tuple[str, Dict[str, Any]]]:
    """(engine kind, role) of a command line, or None: not an inference server's process."""
    for engine in ENGINES.all():
        role = engine.classify(argv)
        if role is not None:
            return engine.name, role
    return None


def default_port(kind: str) -> int:
    """The engine's default port; 0 for an engine this kvforensics does not know (no server of it is read)."""
    engine = for_bundle(kind)
    return engine.default_port if engine.name == kind or kind is None else 0


def _scan(root: str) -> List[Dict[str, Any]]:
    """Every process an engine module recognises, with its kind and role."""
    found = []
    for pid in procfs.pids(root):
        argv = procfs.cmdline(root, pid)
        hit = classify(argv or [])
        if hit is None:
            continue
        proc = procfs.process(root, pid, redact_argv(argv or []))
        if proc is None:
            continue
        kind, role = hit
        proc["_kind"], proc["_role"] = kind, role
        if role["role"] == "server":
            proc["launch"] = role["launch"]
            proc["server_args"] = _server_args(root, pid, proc, kind, (argv or [])[role["flags_at"]:])
        elif "rank" in role:
            proc["rank"] = role["rank"]
        else:
            proc["title"] = role["title"]
        found.append(proc)
    return found


def _server_args(root: str, pid: int, proc: Dict[str, Any], kind: str, argv: List[str]) -> Dict[str, Any]:
    """The server's flags: its command line, then what the files it names set (they win, as in the engine)."""
    engine = ENGINES.get(kind)
    flags = engine.parse_flags(argv)
    if engine.config_flags is not None:
        more, notes = engine.config_flags(root, pid, proc.get("uid"), flags)
        flags.update(more)
        if notes:
            proc["_config_notes"] = notes[:8]
    return redact_mapping(flags)


def _ancestor_server(proc: Dict[str, Any], servers: Dict[int, Any], parents: Dict[int, Any],
                     root: str) -> Optional[int]:
    """Walk parent PIDs up to a server process of the same engine (workers are its descendants)."""
    pid = proc.get("ppid")
    for _ in range(_ANCESTRY_DEPTH):
        if pid is None or pid < 1:  # PID 1 may be the server: a container's entrypoint in its own PID namespace
            return None
        if pid in servers and servers[pid]["_kind"] == proc["_kind"]:
            return pid
        parent = parents.get(pid)
        if parent is None:
            info = procfs.process(root, pid)
            parent = info.get("ppid") if info else None
            parents[pid] = parent
        pid = parent
    return None


def _engine(server: Optional[Dict[str, Any]], kind: str) -> Dict[str, Any]:
    return {"kind": kind, "server": server, "schedulers": [], "helpers": [],
            "server_args": server["server_args"] if server else {}, "launch": server["launch"] if server else None}


def _public(proc: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in proc.items() if not k.startswith("_")}


def _servers(candidates: Dict[int, Any], parents: Dict[int, Any], root: str) -> Tuple[Dict[int, Any], set]:
    """The real servers among the command lines that look like one, and the PIDs that are forked workers.

    A "server" below another server of its engine is either its forked worker (vLLM V0 forks its ranks,
    which keep the server's command line exactly) or the real server under a wrapper that matched too
    (``sudo``, ``timeout 1d``, ``uv run`` … ``vllm serve``): then the wrapper is not a server."""
    forked, wrappers = set(), set()
    for pid, proc in candidates.items():
        above = _ancestor_server(proc, candidates, parents, root)
        if above is None:
            continue
        if proc["cmdline"] == candidates[above]["cmdline"]:
            forked.add(pid)
        else:
            wrappers.add(above)
    return {pid: p for pid, p in candidates.items() if pid not in forked | wrappers}, forked


def _adopter(proc: Dict[str, Any], servers: Dict[int, Any]) -> Optional[int]:
    """A worker its engine marks ``adopted`` descends from no server (Ray's worker actors are children
    of the raylet): the node's one server of its engine owns it; with several, it cannot be placed.
    (Other untitled children must descend from their server.)"""
    if not proc["_role"].get("adopted"):
        return None
    mine = [pid for pid, s in servers.items() if s["_kind"] == proc["_kind"]]
    return mine[0] if len(mine) == 1 else None


def collect(root: str = "/") -> Dict[str, Any]:
    found = _scan(root)
    parents = {p["pid"]: p.get("ppid") for p in found}
    candidates = {p["pid"]: p for p in found if p["_role"]["role"] == "server"}
    servers, forked = _servers(candidates, parents, root)
    by_pid = {pid: _engine(p, p["_kind"]) for pid, p in sorted(servers.items())}
    orphans: Dict[str, Dict[str, Any]] = {}
    for proc in found:
        if proc["pid"] in servers or (proc["pid"] in candidates and proc["pid"] not in forked):
            continue  # a server, or a wrapper around one
        role = proc["_role"]["role"]
        owner = _ancestor_server(proc, servers, parents, root)
        if owner is None and role == "child":
            owner = _adopter(proc, servers)
        if role == "server":  # a forked child of a server
            proc = dict(proc, rank="")
            role = "worker"
        if owner is None:
            if role == "worker":
                orphans.setdefault(proc["_kind"], _engine(None, proc["_kind"]))["schedulers"].append(_public(proc))
            continue  # a helper or an untitled child without a server is not an engine's
        key = "schedulers" if role in ("worker", "child") else "helpers"
        item = _public(proc)
        if key == "schedulers":
            item.setdefault("rank", "")
            item.pop("server_args", None)
            item.pop("launch", None)
        by_pid[owner][key].append(item)
    engines = [dict(e, server=_public(e["server"]) if e["server"] else None) for e in by_pid.values()]
    engines.extend(orphans.values())
    for e in engines:
        e["schedulers"].sort(key=lambda p: _rank_key(p["rank"]))
    problems = _config_problems(servers)
    for kind, group in orphans.items():
        pids = ", ".join(str(p["pid"]) for p in group["schedulers"])
        problems.append({"code": "engines.server_not_found",
                         "message": "{} worker processes without a visible server process (its command line "
                                    "holds the flags): {}".format(ENGINES.get(kind).display, pids)})
    return {"status": "ok" if engines else "absent", "engines": engines, "problems": problems}


def _config_problems(servers: Dict[int, Any]) -> List[Dict[str, str]]:
    """The config files a server names that were not read, each said once."""
    return [{"code": "engines.config_not_read", "message": "{} server PID {}: {}".format(
        ENGINES.get(p["_kind"]).display, pid, note)} for pid, p in sorted(servers.items())
        for note in p.get("_config_notes", ())]


def _rank_key(rank: str) -> List[Any]:
    out: List[Any] = []
    for token in rank.replace("_", " ").split():
        name = token.rstrip("0123456789")
        out.append((name, int(token[len(name):][:9] or 0)))  # a forged title cannot make a huge int
    return out
