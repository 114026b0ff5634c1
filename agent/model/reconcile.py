"""Live reconciliation: what the GPUs hold now (NVML) against what the engine's log planned.

Pure: a snapshot dict in (``collectors/snapshot.py``), an ``Inspection`` out. Per GPU the
ledger splits NVML's used memory into the engine's logged items (weights, KV pool, graphs,
draft, workspaces), the rest of the engine process (CUDA context, allocator cache,
activations), other processes, PIDs that no longer exist, and what no process accounts for.
The findings and recommendations come from the one rule book (``agent/model/rulebook.py``), which sees
the log's analysis, this live ledger and, when ``kvforensics record`` keeps it, the history.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from kvforensics.agent.model import evidence, rulebook
from kvforensics.agent.model.analyze import analyze_startup
from kvforensics.agent.model.evidence import Engine, Gpu, Process, Snapshot
from kvforensics.agent.model.live import GpuLedger, GpuProcess, Inspection, ItemKind, LedgerItem, Owner
from kvforensics.agent.model.records import Options, Problem
from kvforensics.agent.model.verdict import verdict
from kvforensics.agent.plugin import ENGINES
from kvforensics.collectors import events
from kvforensics.collectors.plugin import ENGINES as COLLECTORS
from kvforensics.collectors.plugin import for_bundle


def _short(cmd: tuple) -> str:
    text = " ".join(cmd)
    return text if len(text) <= 80 else text[:77] + "..."


def _analysis(snap: Snapshot, target: str, opts: Options) -> Tuple[Optional[Any], List[Problem]]:
    """The analysis of the snapshot's startup lines, or None with the problem that says why."""
    log = snap.engine_log
    # Per engine: how its log lines split into startups (its collectors' plug-in).
    plugin = COLLECTORS.find(log.engine) or for_bundle(snap.selected.kind if snap.selected else None)
    # Only the last startup is analysed: the segmenter keeps no other (a bundle may hold a million lines).
    startups = events.segment(log.lines, plugin.parse_line, plugin.segmenter(keep=-1)) if log.lines else []
    if not startups:
        # Lines that hold no startup of the engine they are read as (a forged or mixed-up bundle): say so,
        # or the report's null startup would have no reason.
        return None, [Problem("engine_log.no_startup", "the {:,} saved log line(s) hold no {} startup: the log is not "
                              "used".format(len(log.lines), plugin.display))] if log.lines else []
    opts = replace(opts, model_config=dict(snap.model_config) if snap.model_config else opts.model_config,
                   model_config_path=snap.model_config_path or opts.model_config_path)
    return analyze_startup(startups[-1], target, opts, log.index, log.count, log.notes + events.notes(startups[-1]),
                           fallback_args=dict(snap.selected.server_args) if snap.selected else None), []


def _owner(pid: int, info: Optional[Process], engine_pids: set, other_pids: set) -> Owner:
    if info is not None and info.other_namespace:
        return Owner.OTHER_NAMESPACE
    if info is not None and info.missing:
        return Owner.ORPHANED
    if pid in engine_pids:
        return Owner.ENGINE
    if pid in other_pids:
        return Owner.OTHER_ENGINE
    return Owner.FOREIGN


def _processes(gpu: Gpu, procs: Mapping[int, Process], ranks: Dict[int, str], engine_pids: set,
               other_pids: set) -> List[GpuProcess]:
    out = []
    for p in gpu.processes:
        info = procs.get(p.pid)
        out.append(GpuProcess(pid=p.pid, used_bytes=p.used_bytes, name=_short(info.cmdline if info else ()) or "?",
                              owner=_owner(p.pid, info, engine_pids, other_pids), rank=ranks.get(p.pid),
                              user=info.user if info else None, container=info.container if info else None))
    return out


def _items(gpu: Gpu, processes: List[GpuProcess], logged: List[LedgerItem]) -> List[LedgerItem]:
    """NVML's used memory split by holder; the items sum to used (+ reserved + free)."""
    held = {owner: sum(p.used_bytes or 0 for p in processes if p.owner is owner) for owner in Owner}
    items: List[LedgerItem] = []
    if any(p.owner is Owner.ENGINE for p in processes):
        items.extend(logged)
        rest = held[Owner.ENGINE] - sum(x.bytes or 0 for x in logged)
        if logged:
            items.append(LedgerItem(ItemKind.ENGINE_UNLOGGED, rest, "NVML process used − logged items: CUDA context, "
                                    "allocator cache, activations"))
        else:
            items.append(LedgerItem(ItemKind.ENGINE_PROCESS, rest, "nvmlDeviceGetComputeRunningProcesses"))
    for owner, kind, source in ((Owner.OTHER_ENGINE, ItemKind.OTHER_ENGINES,
                                 "NVML process list: another server's schedulers"),
                                (Owner.FOREIGN, ItemKind.FOREIGN, "NVML process list"),
                                (Owner.ORPHANED, ItemKind.ORPHANED, "NVML process list, absent from /proc"),
                                (Owner.OTHER_NAMESPACE, ItemKind.OTHER_NAMESPACE,
                                 "NVML process list: host PIDs this PID namespace cannot see")):
        if held[owner]:
            items.append(LedgerItem(kind, held[owner], source))
    if gpu.used_bytes is not None and all(p.used_bytes is not None for p in processes):
        items.append(LedgerItem(ItemKind.NO_PROCESS, gpu.used_bytes - sum(held.values()), "NVML used − Σ process used"))
    if gpu.reserved_bytes is not None:
        items.append(LedgerItem(ItemKind.RESERVED, gpu.reserved_bytes, "nvmlDeviceGetMemoryInfo_v2 reserved"))
    if gpu.free_bytes is not None:
        items.append(LedgerItem(ItemKind.FREE, gpu.free_bytes, "nvmlDeviceGetMemoryInfo_v2 free"))
    return items


def _gpu_ledger(gpu: Gpu, procs: Mapping[int, Process], placed: Dict[int, Tuple[str, List[LedgerItem]]],
                engine_pids: set, other_pids: set) -> GpuLedger:
    ranks = {pid: rank for pid, (rank, _) in placed.items()}
    processes = _processes(gpu, procs, ranks, engine_pids, other_pids)
    ranked = next((p for p in reversed(processes) if p.rank is not None), None)
    rank = ranked.rank if ranked else None
    items = _items(gpu, processes, placed[ranked.pid][1] if ranked else [])
    return GpuLedger(index=gpu.index, status=gpu.status, uuid=gpu.uuid, name=gpu.name, total_bytes=gpu.total_bytes,
                     reserved_bytes=gpu.reserved_bytes, used_bytes=gpu.used_bytes, free_bytes=gpu.free_bytes,
                     processes=tuple(processes), rank=rank, items=tuple(items), pci_bus_id=gpu.pci_bus_id,
                     problems=tuple(Problem(p.code, "GPU {}: {}".format(gpu.index, p.message)) for p in gpu.problems))


def _status(snap: Snapshot, analysis: Optional[Any], gpus: List[GpuLedger], nothing: bool) -> str:
    if nothing:
        return "error"
    if snap.nvml.status != "ok" or snap.selected is None or analysis is None or any(g.status != "ok" for g in gpus):
        return "partial"
    return "ok"


def reconcile(snap: Snapshot, target: str, opts: Options, history: Optional[Any] = None) -> Inspection:
    """The live ledger of a snapshot, without findings (the rule book adds those)."""
    engine: Optional[Engine] = snap.selected
    other_pids = {pid for e in snap.others for pid in e.pids}
    engine_pids = set(engine.pids) if engine else set()
    analysis, extra = _analysis(snap, target, opts)
    read_as = getattr(analysis, "engine", None)  # an engine's analysis names its engine; a missing name is no match
    if engine is not None and analysis is not None and read_as != engine.kind:
        # a forged or mixed-up bundle: the log is another engine's than the server found
        extra.append(Problem("engine_log.other_engine", "the startup log is {}'s but the server is {}'s: the "
                             "log is not used".format(read_as or "an unnamed engine", engine.kind)))
        analysis = None
    gpu_of: Dict[int, int] = {}
    for g in snap.nvml.gpus:
        for p in g.processes:
            gpu_of.setdefault(p.pid, g.index)
    # Which GPU process is which rank, with the items its log says that rank holds: the engine's own.
    placed = ENGINES.get(engine.kind).place(engine, analysis, gpu_of) if engine else {}
    gpus = [_gpu_ledger(g, snap.processes, placed, engine_pids, other_pids) for g in snap.nvml.gpus]
    problems = list(snap.problems) + extra + [p for g in gpus for p in g.problems]
    nothing = (snap.nvml.status in ("absent", "failed", None) and snap.host_memory.status in ("failed", None)
               and not snap.engines)
    return Inspection(target=target, status=_status(snap, analysis, gpus, nothing), problems=tuple(problems),
                      snapshot=snap, analysis=analysis, gpus=tuple(gpus), host_memory=snap.host_memory, options=opts,
                      collected_nothing=nothing, history=history,
                      engine=None if engine is None else engine.label, engine_kind=engine.kind if engine else None,
                      engine_args=None if engine is None else dict(engine.server_args),
                      other_engines=snap.others)


def inspect_snapshot(snap: Union[Dict[str, Any], Snapshot], target: str, opts: Options,
                     history: Optional[Any] = None) -> Inspection:
    """Reconcile a snapshot (a dict is validated and typed first: ``evidence.parse``) and run the
    rule book over it. ``history``: the current engine run's recorded samples; recommendations
    then rest on the run's low-water free memory instead of one look."""
    typed = snap if isinstance(snap, Snapshot) else evidence.parse(snap)
    return _judged(reconcile(typed, target, opts, history))


def with_history(insp: Inspection, history: Any) -> Inspection:
    """``inspect_snapshot`` of the same snapshot with the engine run's history (record, after its sample):
    the rule book judges again; the ledger and the startup's analysis are reused, as the history changes
    neither (reconcile only carries it), so the startup is not parsed and analysed a second time."""
    return _judged(replace(insp, history=history, findings=(), recommendations=(), verdict=None))


def _judged(insp: Inspection) -> Inspection:
    """The rule book's findings, recommendations and verdict over a reconciled inspection."""
    ctx = rulebook.Context.on_node(insp)
    findings, recommendations = rulebook.findings(ctx), rulebook.recommendations(ctx)
    return replace(insp, findings=tuple(findings), recommendations=tuple(recommendations),
                   verdict=verdict(insp.analysis, True, findings, recommendations))
