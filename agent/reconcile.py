"""Live reconciliation: what the GPUs hold now (NVML) against what the engine's log planned.

Pure: a snapshot dict in (``collectors/snapshot.py``), an ``Inspection`` out. Per GPU the
ledger splits NVML's used memory into the engine's logged items (weights, KV pool, graphs,
draft, workspaces), the rest of the engine process (CUDA context, allocator cache,
activations), other processes, PIDs that no longer exist, and what no process accounts for.
Findings and recommendations here rest on measurement: NVML now, or the engine run's recorded
low-water mark when ``kvforensics record`` has history for it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

from agent.sglang.analysis import Analysis, analyze_startup
from agent.sglang.ledger import RankLedger
from agent.sglang.recommend import gain_requests, mem_fraction_change
from agent.records import Finding, Options, Problem, Recommendation, most_severe_first
from agent.sglang.rules import IMBALANCE_WARN_BYTES, UNUSED_WARN_BYTES, gib
from collectors.snapshot import engine_port, selected_engine
from collectors.sglang.startups import segment_lines

HOST_RESERVE_BYTES = 10 << 30  # SGLang keeps 10 GiB of host RAM free for HiCache (research §5)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: Optional[int]
    name: str  # command line, shortened
    owner: str  # "engine" | "foreign" | "orphaned"
    rank: Optional[str] = None
    user: Optional[str] = None
    container: Optional[str] = None


@dataclass(frozen=True)
class GpuLedger:
    """One GPU now. NVML figures are raw; the split below them is the reconciliation."""

    index: int
    status: str
    uuid: Optional[str]
    name: Optional[str]
    total_bytes: Optional[int]
    reserved_bytes: Optional[int]
    used_bytes: Optional[int]
    free_bytes: Optional[int]
    processes: Tuple[GpuProcess, ...]
    rank: Optional[str] = None  # the engine rank running here
    items: Tuple[Tuple[str, Optional[int], str], ...] = ()  # (label, bytes, source), sums to used
    problems: Tuple[Problem, ...] = ()


@dataclass(frozen=True)
class Inspection:
    target: str
    status: str  # "ok" | "partial" | "error"
    problems: Tuple[Problem, ...]
    snapshot: Dict[str, Any]
    analysis: Optional[Analysis]
    gpus: Tuple[GpuLedger, ...]
    host_memory: Dict[str, Any]
    options: Options
    findings: Tuple[Finding, ...] = ()
    recommendations: Tuple[Recommendation, ...] = ()
    collected_nothing: bool = False
    engine: Optional[str] = None  # "sglang-<port>" of the engine explained
    engine_args: Optional[Dict[str, Any]] = None  # its flags from the command line (secrets redacted)
    history: Optional[Any] = None  # agent.history.RunStats of the current engine run, when recorded


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


def _gpu_ledger(gpu: Dict[str, Any], procs: Dict[str, Any], scheduler_ranks: Dict[int, str],
                engine_pids: set, other_pids: set, analysis: Optional[Analysis]) -> GpuLedger:
    processes: List[GpuProcess] = []
    rank = None
    for p in gpu.get("processes", []):
        info = procs.get(str(p["pid"]), {})
        if info.get("missing"):
            owner = "orphaned"
        elif p["pid"] in engine_pids:
            owner = "engine"
        elif p["pid"] in other_pids:
            owner = "other_engine"
        else:
            owner = "foreign"
        r = scheduler_ranks.get(p["pid"])
        if r is not None:
            rank = r
        container = info.get("container")
        processes.append(GpuProcess(p["pid"], p.get("used_bytes"), _short(info.get("cmdline") or []) or "?", owner, r,
                                    info.get("user"), "{}:{}".format(container["runtime"], container["id"][:12])
                                    if container else None))
    items: List[Tuple[str, Optional[int], str]] = []
    used = gpu.get("used_bytes")
    engine_used = sum(p.used_bytes or 0 for p in processes if p.owner == "engine")
    led = _rank_ledger(analysis, rank)
    if processes and any(p.owner == "engine" for p in processes):
        logged: List[Tuple[str, Optional[int], str]] = []
        if led is not None:
            t, d = led.target, led.draft
            logged = [("weights", t.weights_bytes, t.sources.get("weights_bytes", "")),
                      ("KV pool", t.kv_bytes, t.sources.get("kv_bytes", "")),
                      ("Mamba state", t.mamba_bytes, t.sources.get("mamba_bytes", "")),
                      ("CUDA graphs", t.graph_bytes, t.sources.get("graph_bytes", "")),
                      ("workspaces + req_to_token", (t.workspace_bytes or 0) + (led.req_to_token_bytes or 0) or None,
                       "log gap before capture + formula"),
                      ("draft model", d.total_bytes if d else None, "draft weights + KV + graphs from the log")]
            logged = [x for x in logged if x[1]]
        items.extend(logged)
        rest = engine_used - sum(x[1] or 0 for x in logged)
        items.append(("engine, not in the log" if logged else "engine process",
                      rest, "NVML process used − logged items: CUDA context, allocator cache, activations"
                      if logged else "nvmlDeviceGetComputeRunningProcesses"))
    foreign = sum(p.used_bytes or 0 for p in processes if p.owner == "foreign")
    orphaned = sum(p.used_bytes or 0 for p in processes if p.owner == "orphaned")
    others = sum(p.used_bytes or 0 for p in processes if p.owner == "other_engine")
    if others:
        items.append(("other SGLang engines", others, "NVML process list: another server's schedulers"))
    if foreign:
        items.append(("other processes", foreign, "NVML process list"))
    if orphaned:
        items.append(("PIDs that no longer exist", orphaned, "NVML process list, absent from /proc"))
    if used is not None and all(p.used_bytes is not None for p in processes):
        items.append(("no process (driver, other namespaces)", used - engine_used - others - foreign - orphaned,
                      "NVML used − Σ process used"))
    if gpu.get("reserved_bytes") is not None:
        items.append(("reserved by the driver", gpu["reserved_bytes"], "nvmlDeviceGetMemoryInfo_v2 reserved"))
    if gpu.get("free_bytes") is not None:
        items.append(("free", gpu["free_bytes"], "nvmlDeviceGetMemoryInfo_v2 free"))
    return GpuLedger(gpu["index"], gpu.get("status", "ok"), gpu.get("uuid"), gpu.get("name"), gpu.get("total_bytes"),
                     gpu.get("reserved_bytes"), used, gpu.get("free_bytes"), tuple(processes), rank, tuple(items),
                     tuple(Problem(p["code"], "GPU {}: {}".format(gpu["index"], p["message"]))
                           for p in gpu.get("problems", [])))


def inspect_snapshot(snap: Dict[str, Any], target: str, opts: Options, history: Optional[Any] = None) -> Inspection:
    """``history``: the current engine run's recorded samples; recommendations then rest on the
    run's low-water free memory instead of one look."""
    problems: List[Problem] = []
    for key in ("nvml", "host_memory", "engines", "engine_log", "model_config", "engine_http"):
        for p in (snap.get(key) or {}).get("problems", []):
            problems.append(Problem(p["code"], p["message"]))
    for note in (snap.get("engine_log") or {}).get("notes", []):
        problems.append(Problem("engine_log.reader", note))
    engine_list = (snap.get("engines") or {}).get("engines", [])
    engine = selected_engine(snap)
    others = [e for e in engine_list if e is not engine]
    other_pids = {p["pid"] for e in others for p in _engine_processes(e)}
    engine_pids = set()
    scheduler_ranks: Dict[int, str] = {}
    if engine:
        for s in engine["schedulers"]:
            engine_pids.add(s["pid"])
            scheduler_ranks[s["pid"]] = s["rank"]
        for h in engine.get("helpers", []):
            engine_pids.add(h["pid"])
        if engine.get("server"):
            engine_pids.add(engine["server"]["pid"])
    analysis = _analysis(snap, engine, target, opts)
    procs = (snap.get("gpu_processes") or {}).get("processes", {})
    gpus = tuple(_gpu_ledger(g, procs, scheduler_ranks, engine_pids, other_pids, analysis)
                 for g in (snap.get("nvml") or {}).get("gpus", []))
    for g in gpus:
        problems.extend(g.problems)
    host = snap.get("host_memory") or {}
    nothing = ((snap.get("nvml") or {}).get("status") in ("absent", "failed", None)
               and host.get("status") in ("failed", None) and not engine_list)
    status = "ok"
    if nothing:
        status = "error"
    elif (snap.get("nvml") or {}).get("status") != "ok" or engine is None or analysis is None \
            or any(g.status != "ok" for g in gpus):
        status = "partial"
    insp = Inspection(target, status, tuple(problems), snap, analysis, gpus, host, opts,
                      collected_nothing=nothing, history=history,
                      engine=None if engine is None else "sglang-{}".format(engine_port(engine)),
                      engine_args=None if engine is None else dict(engine.get("server_args") or {}))
    found = _findings(insp, engine) + _other_engines(insp, others)
    recs = _recommendations(insp)
    return replace(insp, findings=tuple(found), recommendations=tuple(recs))


# --- findings ------------------------------------------------------------------------------

def _engine_gpus(insp: Inspection) -> List[GpuLedger]:
    return [g for g in insp.gpus if g.rank is not None]


def _cell(insp: Inspection) -> Optional[int]:
    return insp.analysis.budget.cell_bytes if insp.analysis else None


def _findings(insp: Inspection, engine: Optional[Dict[str, Any]]) -> List[Finding]:
    out: List[Finding] = []
    nv = insp.snapshot.get("nvml") or {}
    if nv.get("status") in ("absent", "failed"):
        msg = "; ".join(p["message"] for p in nv.get("problems", [])) or "NVML unavailable"
        out.append(Finding("nvml_unavailable", "warning", "No GPU information: " + msg,
                           "Without NVML kvforensics cannot see GPU memory; host memory and engine processes are "
                           "still reported.", None, ("nvml",)))
    for g in insp.gpus:
        if g.status == "lost":
            out.append(Finding("gpu_lost", "critical", "GPU {} is lost".format(g.index),
                               "NVML answers GPU_IS_LOST: the GPU fell off the bus or hit a fatal error. It needs a "
                               "reset (nvidia-smi -r) or a reboot; any engine rank on it is dead.", None,
                               ("nvmlDeviceGetHandleByIndex({})".format(g.index),)))
    if engine is None:
        out.append(Finding("engine_not_found", "info", "No SGLang server or scheduler process on this node",
                           "Looked for `sglang.launch_server`, `sglang serve` and `sglang::scheduler*` command lines "
                           "in /proc.", None, ("/proc/*/cmdline",)))
    elif insp.analysis is None:
        log = insp.snapshot.get("engine_log") or {}
        why = "; ".join(p["message"] for p in log.get("problems", [])) or "no startup lines"
        out.append(Finding("engine_log_missing", "warning", "The engine's startup log could not be read",
                           why + ". Live GPU numbers are shown, but not what the engine allocated; pass "
                           "--log PATH|journal:UNIT|docker:NAME.", None, (log.get("source") or "engine_log",)))
    if insp.analysis is not None:
        keep = {"startup_failed", "mem_fraction_semantics", "kv_budget_check", "reserve_breakdown",
                "draft_in_reserve", "draft_in_budget", "kv_geometry", "kv_geometry_mismatch",
                "mem_fraction_adjusted", "max_running_requests_reduced", "max_total_tokens_ignored", "hicache_host_pool"}
        out.extend(f for f in insp.analysis.findings if f.code in keep)
    out.extend(_unused(insp))
    out.extend(_foreign(insp))
    out.extend(_orphaned(insp))
    out.extend(_imbalance(insp))
    out.extend(_concurrency(insp))
    out.extend(_host_ram(insp))
    return most_severe_first(out)


def _min_free(insp: Inspection) -> Optional[GpuLedger]:
    gpus = [g for g in _engine_gpus(insp) if g.free_bytes is not None]
    return min(gpus, key=lambda g: g.free_bytes or 0) if gpus else None


def _span(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return "{:.0f} days".format(seconds / 86400)
    if seconds >= 2 * 3600:
        return "{:.0f} hours".format(seconds / 3600)
    return "{:.0f} minutes".format(seconds / 60)


def lowest_free(insp: Inspection) -> Optional[Tuple[GpuLedger, int, str]]:
    """(GPU, lowest free bytes, how it was measured) over the engine's GPUs.

    With recorded history for this engine run (at least two samples), the run's low-water
    mark; otherwise NVML now."""
    now = _min_free(insp)
    if now is None or now.free_bytes is None:
        return None
    h = insp.history
    if h is not None and h.samples >= 2:
        engine_idx = {g.index: g for g in _engine_gpus(insp)}
        marks = [(lw.min_free_bytes, engine_idx[lw.gpu]) for lw in h.gpus
                 if lw.gpu in engine_idx and lw.min_free_bytes is not None]
        if marks:
            value, gpu = min(marks, key=lambda m: m[0])
            if now.free_bytes < value:
                value, gpu = now.free_bytes, now
            return gpu, value, "measured over {}, {:,} samples: lowest free {} on GPU {}".format(
                _span(h.span_s), h.samples, gib(value), gpu.index)
    return now, now.free_bytes, "NVML now: {} free on GPU {}".format(gib(now.free_bytes), now.index)


def _unused(insp: Inspection) -> List[Finding]:
    found = lowest_free(insp)
    if found is None:
        return []
    low, free, how = found
    margin = insp.options.margin_bytes
    spare = free - margin
    n = len(_engine_gpus(insp))
    if spare < UNUSED_WARN_BYTES:
        if free < margin:
            return [Finding("low_headroom", "warning", "Only {} free on GPU {}, below the {} margin".format(
                gib(free), low.index, gib(margin)),
                "{}. Out-of-memory errors under load are likely; give memory back with a lower "
                "--mem-fraction-static.".format(how), free,
                ("nvmlDeviceGetMemoryInfo_v2(GPU {}).free".format(low.index),))]
        return []
    cell = _cell(insp)
    tokens = " ≈ {:,} more KV tokens per rank".format(spare // cell) if cell else ""
    return [Finding("unused_gpu_memory", "warning",
                    "{} unused on each of the engine's {} GPU(s)".format(gib(spare), n),
                    "{} ({} {}). SGLang sizes every rank alike, so the least free GPU is what can be given to the KV "
                    "pool. Minus the {} margin: {}{}.".format(how, low.rank, low.name or "", gib(margin), gib(spare), tokens),
                    spare, ("nvmlDeviceGetMemoryInfo_v2(GPU {}).free".format(low.index),))]


def _foreign(insp: Inspection) -> List[Finding]:
    out = []
    cell = _cell(insp)
    engine_gpus = {g.index for g in _engine_gpus(insp)}
    ranks = len(engine_gpus)
    for g in insp.gpus:
        for p in g.processes:
            if p.owner != "foreign" or not p.used_bytes:
                continue
            on_engine = g.index in engine_gpus
            cost = ""
            if on_engine and cell:
                cost = (" SGLang sizes every rank's KV pool from the minimum free memory across ranks, so while it "
                        "runs a restart gives all {} rank(s) {} less each: {:,} KV tokens per rank.").format(
                            ranks, gib(p.used_bytes), p.used_bytes // cell)
            who = ", ".join(x for x in ("user " + p.user if p.user else "", p.container or "") if x)
            out.append(Finding("foreign_gpu_process", "warning" if on_engine else "info",
                               "PID {} ({}) holds {} on GPU {}{}".format(
                                   p.pid, p.name, gib(p.used_bytes), g.index,
                                   ", beside engine rank " + g.rank if on_engine and g.rank else ""),
                               "{}A process that is not this engine's uses GPU memory.{}".format(
                                   who + ". " if who else "", cost),
                               p.used_bytes, ("nvmlDeviceGetComputeRunningProcesses(GPU {})".format(g.index),
                                              "/proc/{}/cmdline".format(p.pid))))
    return out


def _orphaned(insp: Inspection) -> List[Finding]:
    out = []
    for g in insp.gpus:
        for p in g.processes:
            if p.owner == "orphaned":
                out.append(Finding("orphaned_gpu_memory", "error",
                                   "{} on GPU {} is held by PID {}, which does not exist".format(
                                       gib(p.used_bytes) if p.used_bytes is not None else "memory", g.index, p.pid),
                                   "NVML still charges memory to a process /proc does not have: a leaked CUDA context "
                                   "(find holders with `lsof /dev/nvidia*`), or a process in another PID namespace "
                                   "when kvforensics runs inside a container.", p.used_bytes,
                                   ("nvmlDeviceGetComputeRunningProcesses(GPU {})".format(g.index), "/proc/{}".format(p.pid))))
    return out


def _imbalance(insp: Inspection) -> List[Finding]:
    gpus = [g for g in _engine_gpus(insp) if g.free_bytes is not None]
    if len(gpus) < 2:
        return []
    lo = min(gpus, key=lambda g: g.free_bytes or 0)
    hi = max(gpus, key=lambda g: g.free_bytes or 0)
    spread = (hi.free_bytes or 0) - (lo.free_bytes or 0)
    if spread < IMBALANCE_WARN_BYTES:
        return []
    cell = _cell(insp)
    cost = " ≈ {:,} tokens".format(spread // cell) if cell else ""
    return [Finding("rank_imbalance", "warning", "Free memory differs by {} across the engine's GPUs".format(gib(spread)),
                    "GPU {} ({}) has {} free, GPU {} ({}) {}. Ranks are sized from the minimum, so the others leave up "
                    "to {}{} each unused.".format(lo.index, lo.rank, gib(lo.free_bytes), hi.index, hi.rank,
                                                  gib(hi.free_bytes), gib(spread), cost),
                    spread, ("nvmlDeviceGetMemoryInfo_v2 free, GPUs {} and {}".format(lo.index, hi.index),))]


def _concurrency(insp: Inspection) -> List[Finding]:
    a = insp.analysis
    base = next((f for f in (a.findings if a else ()) if f.code == "concurrency_bound"), None)
    metrics = (insp.snapshot.get("engine_http") or {}).get("metrics") or {}
    if base is None:
        return []
    if not metrics:
        return [base]
    live = []
    for key, label, fmt in (("sglang:num_running_reqs", "running", "{:.0f}"), ("sglang:num_queue_reqs", "queued", "{:.0f}"),
                            ("sglang:token_usage", "KV token usage", "{:.0%}"), ("sglang:num_used_tokens", "tokens in use", "{:,.0f}")):
        if key in metrics:
            live.append("{} {}".format(label, fmt.format(metrics[key])))
    url = (insp.snapshot.get("engine_http") or {}).get("url")
    queued = metrics.get("sglang:num_queue_reqs", 0)
    sev = "warning" if queued > 0 or base.severity == "warning" else "info"
    return [replace(base, severity=sev, detail=base.detail + " Live ({}/metrics): {}.".format(url, ", ".join(live)),
                    evidence=base.evidence + ("{}/metrics".format(url),))]


@dataclass(frozen=True)
class HostOffload:
    ranks: int
    per_rank_bytes: int  # host RAM per rank after SGLang's 10 GiB reserve
    size_gb: int  # --hicache-size value: decimal GB per rank, rounded down
    tokens: int  # KV tokens that size holds per rank


def host_offload(insp: Inspection) -> Optional[HostOffload]:
    """HiCache sizing from measured host RAM: (available − 10 GiB) // ranks on this host (SGLang 0.5.19+)."""
    a = insp.analysis
    avail = insp.host_memory.get("available_bytes")
    if a is None or avail is None or a.failed is not None or not a.budget.cell_bytes:
        return None
    ranks = max(1, len(_engine_gpus(insp)) or len(a.ranks))
    per_rank = (avail - HOST_RESERVE_BYTES) // ranks
    size_gb = int(per_rank // 10**9)
    if size_gb < 1 or a.summary.max_total_num_tokens is None:
        return None
    return HostOffload(ranks, per_rank, size_gb, size_gb * 10**9 // a.budget.cell_bytes)


def _host_ram(insp: Inspection) -> List[Finding]:
    a = insp.analysis
    off = host_offload(insp)
    if a is None or off is None:
        return []
    avail = insp.host_memory["available_bytes"]
    ratio = off.tokens / (a.summary.max_total_num_tokens or 1)
    enabled = bool(a.server_args.get("enable_hierarchical_cache"))
    return [Finding("host_ram_offload", "info",
                    "Host RAM could hold {:,} KV tokens per rank ({:.1f}× the GPU pool) as a HiCache tier".format(
                        off.tokens, ratio),
                    "{} host RAM available (MemAvailable{}), minus SGLang's 10 GiB host reserve, split over {} rank(s): "
                    "{:.2f} GB each; --hicache-size {} (decimal GB, rounded down, as SGLang reads it) at {:,} B/token.{}".format(
                        gib(avail), ", cgroup-bounded" if insp.host_memory.get("cgroup_limit_bytes") else "", off.ranks,
                        off.per_rank_bytes / 1e9, off.size_gb, a.budget.cell_bytes,
                        " HiCache is already enabled." if enabled else ""),
                    off.per_rank_bytes * off.ranks, ("/proc/meminfo MemAvailable",))]


def _other_engines(insp: Inspection, others: List[Dict[str, Any]]) -> List[Finding]:
    servers = [e for e in others if e.get("server")]
    if not servers:
        return []
    parts = []
    for e in servers:
        pids = {s["pid"] for s in e.get("schedulers", [])}
        gpus = sorted({g.index for g in insp.gpus for p in g.processes if p.pid in pids})
        model = e.get("server_args", {}).get("model_path") or "?"
        parts.append("port {} ({}, {} scheduler(s) on GPU {})".format(
            engine_port(e), model, len(pids), ",".join(map(str, gpus)) or "none"))
    return [Finding("other_engines", "info", "{} more SGLang server(s) on this node".format(len(servers)),
                    "Explained here: {}. Also running: {}. Inspect another with --engine PORT.".format(
                        insp.engine or "none", "; ".join(parts)), None, ("/proc/*/cmdline",))]


# --- recommendations -----------------------------------------------------------------------

def _recommendations(insp: Inspection) -> List[Recommendation]:
    a = insp.analysis
    out: List[Recommendation] = []
    if a is None:
        return out
    if a.failed is not None:
        return list(a.recommendations)
    b = a.budget
    found = lowest_free(insp)
    if found is not None and b.mfs is not None and b.pre_min_bytes and b.cell_bytes:
        low, free, how = found
        spare = free - insp.options.margin_bytes
        if spare >= UNUSED_WARN_BYTES or spare < 0:
            new, gain, tokens = mem_fraction_change(b, spare)
            caveat = ("" if insp.history is not None and insp.history.samples >= 2 else
                      " One look at the GPUs: under heavier load free memory can dip lower (kvforensics record keeps "
                      "low-water marks).")
            out.append(Recommendation(
                "--mem-fraction-static", "{:.3f}".format(new), gain, tokens, "measured",
                "{} → {} {} keeping the {} margin → --mem-fraction-static {:.3f} ((Δ {:+.3f}) × pre-load free {} "
                "from the log) → {:+,} tokens per rank at {:,} B/token.{}".format(
                    how, "reclaim" if spare >= 0 else "give back", gib(abs(spare)), gib(insp.options.margin_bytes),
                    new, new - b.mfs, gib(b.pre_min_bytes), tokens, b.cell_bytes, caveat),
                gain_requests(a, tokens)))
    out.extend(r for r in a.recommendations if r.flag in ("--max-running-requests", "--cuda-graph-max-bs",
                                                          "--kv-cache-dtype"))
    off = host_offload(insp)
    if off is not None and not a.server_args.get("enable_hierarchical_cache"):
        out.append(Recommendation(
            "--enable-hierarchical-cache --hicache-size", str(off.size_gb), None, off.tokens, "measured",
            "{} GB per rank of host RAM ({} ranks, SGLang's 10 GiB host reserve kept) holds {:,} tokens of prefix cache "
            "per rank. It keeps more context reusable (shared prefixes, multi-turn); it does not raise how many "
            "requests decode at once.".format(off.size_gb, off.ranks, off.tokens),
            {"at_context_len": 0, "at_request_tokens": 0}))
    return out

