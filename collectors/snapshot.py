"""One snapshot of a node: every collector, timed and isolated, in one JSON-ready dict.

This is what ``kvforensics inspect`` analyses, what ``--save`` writes as an evidence bundle,
and (for remote hosts) what the probe prints. A collector that raises unexpectedly becomes a
``failed`` section with an ``internal.exception`` problem: one bug never loses the others.
Schema ``kvforensics.snapshot/1``; sizes in bytes.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

from kvforensics.collectors import engines, host_memory, nvml, procfs
from kvforensics.collectors.plugin import for_bundle
from kvforensics.collectors.redact import redact_argv

if TYPE_CHECKING:  # parsed only when --engine is given (collectors/selection.py): every probe pays an import
    from kvforensics.collectors import selection

SCHEMA = "kvforensics.snapshot/1"


def _run(name: str, fn: Callable[[], Dict[str, Any]], runs: List[Dict[str, Any]], strict: bool) -> Dict[str, Any]:
    start = time.perf_counter()
    try:
        section = fn()
    except Exception as exc:  # noqa: BLE001 - isolation is the point; strict mode re-raises for tests
        if strict:
            raise
        section = {"status": "failed", "problems": [{"code": "internal.exception",
                                                     "message": "{}: {}: {}".format(name, type(exc).__name__, exc)}]}
    runs.append({"name": name, "status": section.get("status", "ok"), "duration_s": round(time.perf_counter() - start,
                                                                                          4)})
    return section


def _env_hint(root: str, pid: int) -> Dict[str, str]:
    """HF_HOME / HF_HUB_CACHE of a process, to find its model config; nothing else is kept."""
    try:
        with open(os.path.join(root, "proc", str(pid), "environ"), "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key in (b"HF_HOME", b"HF_HUB_CACHE", b"HOME"):
            out[key.decode()] = value.decode("utf-8", "replace")
    return out


def _gpu_processes(root: str, nvml_section: Dict[str, Any]) -> Dict[str, Any]:
    """Every PID NVML reports: its process details, or why /proc has no such PID.

    NVML numbers PIDs in the host's (initial) PID namespace. A PID absent here is ``missing`` (a
    process that exited while the driver still charges it) only when this /proc is the host's;
    from inside a container it lives ``in_other_namespace``. A PID that is absent but numbers a
    process inside a nested namespace (``NSpid:``) is that process."""
    out: Dict[str, Any] = {}
    nested: Optional[Dict[int, int]] = None
    own_ns = procfs.pid_namespace(root)
    for gpu in nvml_section.get("gpus", []):
        for p in gpu.get("processes", []):
            key = str(p["pid"])
            if key in out:
                continue
            info = procfs.process(root, p["pid"])
            if info is None:
                if nested is None:
                    nested = procfs.nspid_index(root)
                if p["pid"] in nested:
                    info = procfs.process(root, nested[p["pid"]])
            if info is None:
                other = own_ns is not None and own_ns != procfs.INIT_PID_NS
                out[key] = {"pid": p["pid"], ("in_other_namespace" if other else "missing"): True}
            else:
                info["cmdline"] = redact_argv(info["cmdline"])
                out[key] = info
    return out


def engine_kind(engine: Dict[str, Any]) -> str:
    """The engine's name as the entry gives it; an entry written before snapshots named engines has
    no kind (collectors/plugin.py for_bundle: the legacy engine's)."""
    kind = engine.get("kind")
    return kind if isinstance(kind, str) and kind else for_bundle(None).name


def engine_port(engine: Dict[str, Any]) -> int:
    default = engines.default_port(engine_kind(engine))
    port = (engine.get("server_args") or {}).get("port", default)
    return port if isinstance(port, int) else default


def selected_engine(snap: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The engine a snapshot explains: the one chosen at collection time (see ``collect``)."""
    section = snap.get("engines") or {}
    engine_list = section.get("engines") or []
    index = section.get("selected")
    if isinstance(index, int) and 0 <= index < len(engine_list):
        return engine_list[index]
    if "selected" in section:  # chosen, but none matched (--engine PORT absent)
        return None
    return primary_engine(engine_list, snap.get("nvml") or {})


def _weights(engine_list: List[Dict[str, Any]], nvml_section: Dict[str, Any]) -> List[int]:
    """GPU memory each engine's processes hold, by NVML."""
    used: Dict[int, int] = {}
    for gpu in nvml_section.get("gpus", []):
        for p in gpu.get("processes", []):
            used[p["pid"]] = used.get(p["pid"], 0) + (p.get("used_bytes") or 0)

    def weight(engine: Dict[str, Any]) -> int:
        procs = list(engine["schedulers"]) + list(engine.get("helpers") or []) + (
            [engine["server"]] if engine.get("server") else [])  # vLLM V0's server holds GPU 0 itself
        return sum(used.get(p["pid"], 0) for p in procs)

    return [weight(e) for e in engine_list]


def primary_engine(engine_list: List[Dict[str, Any]], nvml_section: Dict[str, Any],
                   selector: Optional[selection.EngineSelector] = None) -> Optional[Dict[str, Any]]:
    """The one server ``selector`` names if given (None when it names none or several), else the engine
    holding the most GPU memory (the one worth explaining first on a node that runs several servers)."""
    if not engine_list:
        return None
    if selector is not None:
        named = _named(engine_list, selector)
        return named[0] if len(named) == 1 else None
    weights = _weights(engine_list, nvml_section)
    return engine_list[weights.index(max(weights))]


def _named(engine_list: List[Dict[str, Any]], selector: selection.EngineSelector) -> List[Dict[str, Any]]:
    """The servers the selector names."""
    return [e for e in engine_list if e.get("server") and selector.matches(e, engine_port(e))]


def explained_engines(engine_list: List[Dict[str, Any]], nvml_section: Dict[str, Any],
                      selector: Optional[selection.EngineSelector] = None) -> List[Dict[str, Any]]:
    """The engines one look at the node records: every server ``selector`` names (two pods may serve on one
    port: a port records both); else every engine holding GPU memory (NVML names its processes), most first;
    when NVML names none of them (no NVML, or its PIDs are another PID namespace's), every one with a server
    process; at least the primary."""
    if selector is not None:
        return _named(engine_list, selector)
    primary = primary_engine(engine_list, nvml_section)
    if primary is None:
        return []
    weights = _weights(engine_list, nvml_section)
    holding = [e for w, e in sorted(zip(weights, engine_list), key=lambda x: -x[0]) if w > 0]
    if not holding:
        holding = [e for e in engine_list if e.get("server")]
    return [primary] + [e for e in holding if e is not primary]


def _node(root: str, nvml_lib: Optional[str], strict: bool) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """The node's own sections (GPUs, host memory, engines, GPU processes) and their collector runs."""
    runs: List[Dict[str, Any]] = []
    # uname's nodename is what gethostname(2) answers on Linux, and sys.version's first word what
    # platform.python_version() parses out of it: the same values without importing socket and platform
    # (~3 ms of every probe).
    snap: Dict[str, Any] = {"schema": SCHEMA, "hostname": os.uname().nodename,
                            "taken_at_unix_s": round(time.time(), 3),
                            "probe": {"python": sys.version.split()[0], "platform": sys.platform,
                                      "pid_namespace": procfs.pid_namespace(root)}}
    snap["nvml"] = _run(nvml.NAME, lambda: nvml.collect(nvml_lib), runs, strict)
    snap["host_memory"] = _run(host_memory.NAME, lambda: host_memory.collect(root), runs, strict)
    snap["engines"] = _run(engines.NAME, lambda: engines.collect(root), runs, strict)
    snap["gpu_processes"] = _run("gpu_processes", lambda: {"status": "ok", "processes": _gpu_processes(root,
                                                                                                       snap["nvml"])},
                                 runs, strict)
    return snap, runs


def engine_selector(engine: Optional[Union[str, int]]) -> Optional[selection.EngineSelector]:
    """The --engine value as a selector (None: not given), its parser imported only then."""
    if engine is None:
        return None
    from kvforensics.collectors import selection

    return selection.parse(engine)


def _not_named(snap: Dict[str, Any], selector: selection.EngineSelector) -> None:
    """The problem of an --engine that names no server, or several: which ones the node runs, as --engine
    would name each."""
    from kvforensics.collectors import selection

    engine_list = snap["engines"].get("engines", [])
    servers = [e for e in engine_list if e.get("server")]
    named = _named(engine_list, selector)
    here = ", ".join(selection.describe(e, engine_port(e)) for e in servers) or "none"
    if len(named) > 1:
        problem = {"code": "engines.ambiguous", "message": "--engine {} names {} servers ({}): name one by its pod, "
                   "NAMESPACE/POD[:PORT]".format(selector, len(named), ", ".join(
                       selection.describe(e, engine_port(e)) for e in named))}
    elif selector.pod is None:
        problem = {"code": "engines.port_not_found", "message": "no inference server on port {} (servers here: "
                   "{})".format(selector.port, here)}
    else:
        problem = {"code": "engines.not_found", "message": "no inference server in pod {}/{}{} (servers here: "
                   "{})".format(selector.namespace, selector.pod, "" if selector.port is None else
                                " on port {}".format(selector.port), here)}
    snap["engines"].setdefault("problems", []).append(problem)


def collect(root: str = "/", nvml_lib: Optional[str] = None, log: Optional[str] = None, startup: int = -1,
            model_config_path: Optional[str] = None, http: bool = True, strict: bool = False,
            engine: Optional[Union[str, int]] = None) -> Dict[str, Any]:
    """``engine``: the --engine value naming the server to explain (default: the one with most GPU memory)."""
    selector = engine_selector(engine)
    snap, runs = _node(root, nvml_lib, strict)
    chosen = primary_engine(snap["engines"].get("engines", []), snap["nvml"], selector)
    if selector is not None and chosen is None:
        _not_named(snap, selector)
    return _explain(snap, runs, chosen, root, log, startup, model_config_path, http, strict)


def collect_each(root: str = "/", nvml_lib: Optional[str] = None, log: Optional[str] = None,
                 model_config_path: Optional[str] = None, http: bool = True, strict: bool = False,
                 engine: Optional[Union[str, int]] = None) -> List[Dict[str, Any]]:
    """One snapshot per engine the node runs (``explained_engines``; the primary first), sharing one look
    at the node's own sections; one explaining none when there is none. ``log`` and ``model_config_path``
    name the primary engine's: the others' are found from their processes."""
    selector = engine_selector(engine)
    base, runs = _node(root, nvml_lib, strict)
    chosen = explained_engines(base["engines"].get("engines", []), base["nvml"], selector)
    if not chosen:
        if selector is not None:
            _not_named(base, selector)
        return [_explain(base, runs, None, root, log, -1, model_config_path, http, strict)]
    out = []
    for i, e in enumerate(chosen):
        snap = dict(base, engines=dict(base["engines"]))  # the node's sections are shared, read-only
        out.append(_explain(snap, list(runs), e, root, log if i == 0 else None, -1,
                            model_config_path if i == 0 else None, http, strict))
    return out


def _explain(snap: Dict[str, Any], runs: List[Dict[str, Any]], chosen: Optional[Dict[str, Any]], root: str,
             log: Optional[str], startup: int, model_config_path: Optional[str], http: bool,
             strict: bool) -> Dict[str, Any]:
    """The sections about one engine (``chosen``; None: none): its log, its model's config, its HTTP."""
    engine_list = snap["engines"].get("engines", [])
    snap["engines"]["selected"] = next((i for i, e in enumerate(engine_list) if e is chosen), None)
    server = chosen.get("server") if chosen else None
    args = chosen.get("server_args", {}) if chosen else {}
    kind = engine_kind(chosen) if chosen else None

    # Log parsing (dozens of regexes), HTTP and config reading are imported only when there is
    # something to read: on a host without an engine the probe starts ~40 ms sooner (bench/).
    if log or server is not None:
        from kvforensics.collectors import engine_logs

        def log_section() -> Dict[str, Any]:
            if log:
                return engine_logs.collect(engine_logs.parse_spec(log), None, startup, kind or "auto", root)
            spec, reason = engine_logs.spec_for(server)
            return engine_logs.collect(spec, reason, startup, kind or "auto", root)

        snap["engine_log"] = _run(engine_logs.NAME, log_section, runs, strict)
    else:
        snap["engine_log"] = {"status": "absent", "source": None, "lines": [], "index": None, "count": None,
                              "index_from_end": None, "notes": [], "problems": [
                                  {"code": "engine_log.not_found", "message": "no inference server process found"}]}

    model = args.get("model_path") or args.get("model")  # SGLang's --model-path, vLLM's MODEL / --model

    def config_section() -> Dict[str, Any]:
        from kvforensics.collectors import model_config

        path = model_config_path
        if path is None and model:
            env = _env_hint(root, server["pid"]) if server else {}
            path = model_config.locate(str(model), env, env.get("HOME"))
            if path is None:
                return {"status": "absent", "path": None, "config": None, "problems": [{
                    "code": "model_config.not_found",
                    "message": "no config.json for the model {} (pass --model-config)".format(model)}]}
        try:
            return {"status": "ok", "path": model_config.find_config(path) or path,
                    "config": model_config.load_model_config(path), "problems": []}
        except model_config.ModelConfigError as exc:
            return {"status": "failed", "path": path, "config": None,
                    "problems": [{"code": "model_config.unreadable", "message": str(exc)}]}

    if model_config_path or model:
        snap["model_config"] = _run("model_config", config_section, runs, strict)
    else:
        snap["model_config"] = {"status": "absent", "path": None, "config": None, "problems": []}
    if http and chosen is not None and server is not None:
        from kvforensics.collectors import engine_http

        snap["engine_http"] = _run(engine_http.NAME, lambda: engine_http.collect(args, kind, server["pid"], root), runs,
                                   strict)
    else:
        snap["engine_http"] = {"status": "absent", "url": None, "network_namespace": None, "server_info": None,
                               "metrics": {}, "cache_config": None, "problems": []}
    snap["collector_runs"] = runs
    return snap
