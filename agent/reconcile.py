"""Live reconciliation: what the GPUs hold now (NVML) against what the engine's log planned.

Pure: a snapshot dict in (``collectors/snapshot.py``), an ``Inspection`` out. Per GPU the
ledger splits NVML's used memory into the engine's logged items (weights, KV pool, graphs,
draft, workspaces), the rest of the engine process (CUDA context, allocator cache,
activations), other processes, PIDs that no longer exist, and what no process accounts for.
The findings and recommendations come from the one rule book (``agent/rulebook.py``), which sees
the log's analysis, this live ledger and, when ``kvforensics record`` keeps it, the history.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional

from agent import rulebook
from agent.analyze import analyze_startup
from agent.live import GpuLedger, GpuProcess, Inspection, ItemKind, LedgerItem, Owner
from agent.records import Options, Problem
from agent.sglang.analysis import Analysis
from agent.sglang.ledger import RankLedger
from collectors.sglang.startups import segment_lines
from collectors.snapshot import engine_port, selected_engine


def _short(cmd: List[str]) -> str:
    text = " ".join(cmd)
    return text if len(text) <= 80 else text[:77] + "..."


def _analysis(snap: Dict[str, Any], engine: Optional[Dict[str, Any]], target: str, opts: Options) -> Optional[Analysis]:
    log = snap.get("engine_log") or {}
    lines = log.get("lines") or []
    if not lines:
        return None
    startups = segment_lines(lines)
    if not startups:
        return None
    cfg = (snap.get("model_config") or {}).get("config")
    opts = replace(opts, model_config=cfg or opts.model_config,
                   model_config_path=(snap.get("model_config") or {}).get("path") or opts.model_config_path)
    notes = tuple(log.get("notes") or ())
    return analyze_startup(startups[-1], target, opts, log.get("index"), log.get("count"), notes,
                           fallback_args=(engine or {}).get("server_args"))


def _rank_ledger(analysis: Optional[Analysis], rank: Optional[str]) -> Optional[RankLedger]:
    if analysis is None or rank is None:
        return None
    return next((r for r in analysis.ranks if r.rank == rank), None)


def _engine_processes(engine: Dict[str, Any]) -> List[Dict[str, Any]]:
    return list(engine.get("schedulers", [])) + list(engine.get("helpers", [])) + (
        [engine["server"]] if engine.get("server") else [])


def _owner(pid: int, info: Dict[str, Any], engine_pids: set, other_pids: set) -> Owner:
    if info.get("missing"):
        return Owner.ORPHANED
    if pid in engine_pids:
        return Owner.ENGINE
    if pid in other_pids:
        return Owner.OTHER_ENGINE
    return Owner.FOREIGN


def _processes(gpu: Dict[str, Any], procs: Dict[str, Any], scheduler_ranks: Dict[int, str], engine_pids: set,
               other_pids: set) -> List[GpuProcess]:
    out = []
    for p in gpu.get("processes", []):
        info = procs.get(str(p["pid"]), {})
        container = info.get("container")
        out.append(GpuProcess(p["pid"], p.get("used_bytes"), _short(info.get("cmdline") or []) or "?",
                              _owner(p["pid"], info, engine_pids, other_pids), scheduler_ranks.get(p["pid"]),
                              info.get("user"), "{}:{}".format(container["runtime"], container["id"][:12])
                              if container else None))
    return out


def _logged_items(led: Optional[RankLedger]) -> List[LedgerItem]:
    """What the engine's log says its process on this GPU holds (items the log gives)."""
    if led is None:
        return []
    t, d = led.target, led.draft
    logged = [LedgerItem(ItemKind.WEIGHTS, t.weights_bytes, t.sources.get("weights_bytes", "")),
              LedgerItem(ItemKind.KV_POOL, t.kv_bytes, t.sources.get("kv_bytes", "")),
              LedgerItem(ItemKind.MAMBA, t.mamba_bytes, t.sources.get("mamba_bytes", "")),
              LedgerItem(ItemKind.GRAPHS, t.graph_bytes, t.sources.get("graph_bytes", "")),
              LedgerItem(ItemKind.WORKSPACES, (t.workspace_bytes or 0) + (led.req_to_token_bytes or 0) or None,
                         "log gap before capture + formula"),
              LedgerItem(ItemKind.DRAFT, d.total_bytes if d else None, "draft weights + KV + graphs from the log")]
    return [x for x in logged if x.bytes]


def _items(gpu: Dict[str, Any], processes: List[GpuProcess], led: Optional[RankLedger]) -> List[LedgerItem]:
    """NVML's used memory split by holder; the items sum to used (+ reserved + free)."""
    held = {owner: sum(p.used_bytes or 0 for p in processes if p.owner is owner) for owner in Owner}
    items: List[LedgerItem] = []
    if any(p.owner is Owner.ENGINE for p in processes):
        logged = _logged_items(led)
        items.extend(logged)
        rest = held[Owner.ENGINE] - sum(x.bytes or 0 for x in logged)
        if logged:
            items.append(LedgerItem(ItemKind.ENGINE_UNLOGGED, rest, "NVML process used − logged items: CUDA context, "
                                    "allocator cache, activations"))
        else:
            items.append(LedgerItem(ItemKind.ENGINE_PROCESS, rest, "nvmlDeviceGetComputeRunningProcesses"))
    for owner, kind, source in ((Owner.OTHER_ENGINE, ItemKind.OTHER_ENGINES, "NVML process list: another server's schedulers"),
                                (Owner.FOREIGN, ItemKind.FOREIGN, "NVML process list"),
                                (Owner.ORPHANED, ItemKind.ORPHANED, "NVML process list, absent from /proc")):
        if held[owner]:
            items.append(LedgerItem(kind, held[owner], source))
    used = gpu.get("used_bytes")
    if used is not None and all(p.used_bytes is not None for p in processes):
        items.append(LedgerItem(ItemKind.NO_PROCESS, used - sum(held.values()), "NVML used − Σ process used"))
    if gpu.get("reserved_bytes") is not None:
        items.append(LedgerItem(ItemKind.RESERVED, gpu["reserved_bytes"], "nvmlDeviceGetMemoryInfo_v2 reserved"))
    if gpu.get("free_bytes") is not None:
        items.append(LedgerItem(ItemKind.FREE, gpu["free_bytes"], "nvmlDeviceGetMemoryInfo_v2 free"))
    return items


def _gpu_ledger(gpu: Dict[str, Any], procs: Dict[str, Any], scheduler_ranks: Dict[int, str],
                engine_pids: set, other_pids: set, analysis: Optional[Analysis]) -> GpuLedger:
    processes = _processes(gpu, procs, scheduler_ranks, engine_pids, other_pids)
    rank = next((p.rank for p in reversed(processes) if p.rank is not None), None)
    items = _items(gpu, processes, _rank_ledger(analysis, rank))
    return GpuLedger(gpu["index"], gpu.get("status", "ok"), gpu.get("uuid"), gpu.get("name"), gpu.get("total_bytes"),
                     gpu.get("reserved_bytes"), gpu.get("used_bytes"), gpu.get("free_bytes"), tuple(processes), rank,
                     tuple(items), tuple(Problem(p["code"], "GPU {}: {}".format(gpu["index"], p["message"]))
                                        for p in gpu.get("problems", [])))


def _problems(snap: Dict[str, Any]) -> List[Problem]:
    problems: List[Problem] = []
    for key in ("nvml", "host_memory", "engines", "engine_log", "model_config", "engine_http"):
        for p in (snap.get(key) or {}).get("problems", []):
            problems.append(Problem(p["code"], p["message"]))
    for note in (snap.get("engine_log") or {}).get("notes", []):
        problems.append(Problem("engine_log.reader", note))
    return problems


def _status(snap: Dict[str, Any], engine: Optional[Dict[str, Any]], analysis: Optional[Analysis],
            gpus: List[GpuLedger], nothing: bool) -> str:
    if nothing:
        return "error"
    if (snap.get("nvml") or {}).get("status") != "ok" or engine is None or analysis is None \
            or any(g.status != "ok" for g in gpus):
        return "partial"
    return "ok"


def reconcile(snap: Dict[str, Any], target: str, opts: Options, history: Optional[Any] = None) -> Inspection:
    """The live ledger of a snapshot, without findings (the rule book adds those)."""
    problems = _problems(snap)
    engine_list = (snap.get("engines") or {}).get("engines", [])
    engine = selected_engine(snap)
    others = [e for e in engine_list if e is not engine]
    other_pids = {p["pid"] for e in others for p in _engine_processes(e)}
    engine_pids = {p["pid"] for p in _engine_processes(engine)} if engine else set()
    scheduler_ranks = {s["pid"]: s["rank"] for s in engine["schedulers"]} if engine else {}
    analysis = _analysis(snap, engine, target, opts)
    procs = (snap.get("gpu_processes") or {}).get("processes", {})
    gpus = [_gpu_ledger(g, procs, scheduler_ranks, engine_pids, other_pids, analysis)
            for g in (snap.get("nvml") or {}).get("gpus", [])]
    for g in gpus:
        problems.extend(g.problems)
    host = snap.get("host_memory") or {}
    nothing = ((snap.get("nvml") or {}).get("status") in ("absent", "failed", None)
               and host.get("status") in ("failed", None) and not engine_list)
    return Inspection(target, _status(snap, engine, analysis, gpus, nothing), tuple(problems), snap, analysis,
                      tuple(gpus), host, opts, collected_nothing=nothing, history=history,
                      engine=None if engine is None else "sglang-{}".format(engine_port(engine)),
                      engine_args=None if engine is None else dict(engine.get("server_args") or {}),
                      other_engines=tuple(others))


def inspect_snapshot(snap: Dict[str, Any], target: str, opts: Options, history: Optional[Any] = None) -> Inspection:
    """``history``: the current engine run's recorded samples; recommendations then rest on the
    run's low-water free memory instead of one look."""
    insp = reconcile(snap, target, opts, history)
    return replace(insp, findings=tuple(rulebook.findings(rulebook.Context.on_node(insp))),
                   recommendations=tuple(rulebook.recommendations(rulebook.Context.on_node(insp))))
