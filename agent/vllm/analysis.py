"""One vLLM startup's analysis: per-worker memory ledgers, the era's budget formula, the failure.

Pure: no I/O. The era table (facts from the release wheels): ``u`` (--gpu-memory-utilization)
always multiplies the device total ``T``; what is subtracted from ``T·u`` changed by release:

* V0-a 0.3.3–0.6.3: ``KV = T·u − (init_free − free_after_profile)``; graphs outside the budget.
* V0-b 0.6.4.x and V1-a (V1 ≤ 0.9.0): ``KV = T·u − torch_peak − non_torch`` (other processes in).
* V0-c 0.6.5–0.10.2, V1-b 0.9.1–0.10.2, V1-c 0.11–0.17, V1-d 0.18–0.19: ``KV = T·u − (W + A + N)``;
  graphs outside ``T·u`` (0.18–0.19 only log an estimate).
* V1-e 0.20–0.26: ``KV = ceil(T·u) − (W + A + N) − G_est``: graphs inside; default u 0.92.
* V1-f 0.27+: ``KV = ceil(T·u) − consumed − transient − G_est`` (free-delta accounting).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from agent.citing import CitesEvent, where
from agent.model_geometry import GeometryError, KvGeometry
from agent.records import Finding, KvChange, Options, Problem, Recommendation
from agent.vllm import kv_geometry
from collectors.events import LogEvent
from collectors.lineformat import Version
from collectors.vllm.formats import BY_NAME, GENERIC_CAUSES, PRINT_TOLERANCE_BYTES
from collectors.vllm.startups import Startup

ERAS = (  # (name, since, until, graphs inside the budget)
    ("V0-a", (0, 3, 3), (0, 6, 3), False), ("V0-b", (0, 6, 4), (0, 6, 4), False),
    ("V0-c", (0, 6, 5), (0, 10, 2), False), ("V1-a", (0, 6, 5), (0, 9, 0), False),
    ("V1-b", (0, 9, 1), (0, 10, 2), False), ("V1-c", (0, 11, 0), (0, 17, 99), False),
    ("V1-d", (0, 18, 0), (0, 19, 99), False), ("V1-e", (0, 20, 0), (0, 26, 99), True),
    ("V1-f", (0, 27, 0), (99, 0, 0), True),
)
# One process's CUDA context, which no vLLM line prints: 527 MiB of free memory on an H200 with driver
# 580.159 (bench/RESULTS.md, gpu-check 2026-11-30; NVML charged the process 518 MiB beyond its allocation).
CUDA_CONTEXT_BYTES = 527 << 20
_V1_KINDS = ("available_kv", "kv_tokens", "graph_estimate", "graph_advisory", "suggestion", "graph_pool")
_V1_FMTS = ("free_short", "maxlen_v1", "engine_failed")
_V0_FMTS = ("profile_takes", "profile_budget", "profile_breakdown", "profile_global", "graph_begin",
            "graph_begin_old", "maxlen_v0", "worker_died")
STAGES = ("weights", "profiling", "kv_cache", "graph_capture", "ready")
STAGE_WORDS = {"init": "worker init (the free-memory check)", "weights": "loading the weights",
               "profiling": "the memory profiling run", "kv_cache": "sizing the KV cache",
               "graph_capture": "CUDA graph capture", "ready": "engine ready", "unknown": "an unknown stage"}
_STAGE_OF_KIND = {"weights": "weights", "profile_begin": "profiling", "budget": "profiling",
                  "breakdown": "kv_cache", "global_profile": "kv_cache", "available_kv": "kv_cache",
                  "blocks": "kv_cache", "kv_tokens": "kv_cache", "concurrency": "kv_cache",
                  "graph_begin": "graph_capture", "graph_end": "graph_capture", "init_done": "ready",
                  "serving": "ready"}
_CAUSE_STAGE = {"insufficient_free_memory": "init", "max_model_len_too_large": "kv_cache",
                "no_kv_memory": "kv_cache", "memory_freed_during_profiling": "profiling"}
_FRAME_STAGE = (
    (("init_device", "request_memory"), "init"),
    (("load_model", "load_weights"), "weights"),
    (("determine_num_available_blocks", "determine_available_memory", "profile_run", "_dummy_run",
      "profile_num_available_blocks"), "profiling"),
    (("get_kv_cache_config", "get_kv_cache_configs", "check_enough_kv_cache_memory", "initialize_cache",
      "raise_if_cache_size_invalid", "_verify_args", "initialize_from_config"), "kv_cache"),
    (("capture_model", "capture", "compile_or_warm_up_model", "capture_end"), "graph_capture"),
)


@dataclass(frozen=True)
class Worker:
    """One worker's memory, as its lines print it (bytes; None = not in the log)."""

    rank: str  # the process prefix inside the parentheses ("Worker_TP0 pid=26347"), "" without one
    total_gpu_bytes: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None
    requested_bytes: Optional[int] = None
    weights_bytes: Optional[int] = None
    non_torch_bytes: Optional[int] = None
    activation_peak_bytes: Optional[int] = None
    cuda_graph_bytes: Optional[int] = None
    cuda_graph_estimate_bytes: Optional[int] = None
    available_kv_bytes: Optional[int] = None
    kv_allocated_bytes: Optional[int] = None  # blocks × page bytes: needs the page size (not in the log)
    free_at_start_bytes: Optional[int] = None
    sources: Dict[str, str] = field(default_factory=dict)

    # node_rules reads ranks through ``target.post_load_avail_bytes`` / ``target.sources``.
    @property
    def target(self) -> "Worker":
        return self

    @property
    def post_load_avail_bytes(self) -> Optional[int]:
        return None

    @property
    def kv_bytes(self) -> Optional[int]:
        """The protocol's KV pool per rank: the KV memory vLLM made available."""
        return self.available_kv_bytes


@dataclass(frozen=True)
class Summary:
    """The node_rules protocol's summary: the binding KV report and max_model_len. vLLM prints no
    request-slot count (--max-num-seqs is a flag): max_running_requests stays None, and vLLM's own
    concurrency rule reads 'Maximum concurrency' instead of the shared one."""

    max_total_num_tokens: Optional[int] = None
    max_running_requests: Optional[int] = None
    context_len: Optional[int] = None
    source: str = ""


@dataclass(frozen=True)
class Budget:
    cell_bytes: Optional[int] = None  # KV bytes per token, when the log implies it


@dataclass(frozen=True)
class Era:
    family: Optional[str]  # "V0" | "V1" | None
    since: Optional[Version]
    until: Optional[Version]
    name: Optional[str]  # one of ERAS when the log pins it
    graphs_inside: Optional[bool]  # CUDA graphs inside T·u (True from 0.20.0), None when unknown
    clues: Tuple[str, ...]

    @property
    def conflicting(self) -> bool:
        """The clues contradict each other (no release prints them all): two releases' lines in one
        startup, or an edited log."""
        return self.since is not None and self.until is not None and self.since > self.until

    @property
    def hint(self) -> Optional[str]:
        if self.since is None and self.until is None:
            return self.family
        lo = ".".join(map(str, self.since)) if self.since else "?"
        hi = ".".join(map(str, self.until)) if self.until else "newest"
        if self.conflicting:
            return "{} (conflicting clues: {}+ and ≤ {})".format(self.family or "vLLM", lo, hi)
        return "{} {}–{}".format(self.family or "vLLM", lo, hi)


@dataclass(frozen=True)
class Failure(CitesEvent):
    cause: str
    stage: str
    stage_source: str
    message: str
    rank: Optional[str]
    event: LogEvent


@dataclass(frozen=True)
class Check:
    """Predicted vs logged KV bytes for one worker (kv_budget_check)."""

    rank: str
    formula: str
    predicted_bytes: Optional[int]
    logged_bytes: Optional[int]
    tolerance_bytes: int
    evidence: Tuple[str, ...]

    @property
    def agrees(self) -> Optional[bool]:
        if self.predicted_bytes is None or self.logged_bytes is None:
            return None
        return abs(self.predicted_bytes - self.logged_bytes) <= self.tolerance_bytes


@dataclass(frozen=True)
class Analysis:
    target: str
    status: str
    problems: Tuple[Problem, ...]
    era: Era
    server_args: Dict[str, Any]
    startup_index: Optional[int]
    startup_count: Optional[int]
    startup_first_line: Optional[int]
    ranks: Tuple[Worker, ...]
    kv_cache_tokens: Optional[int]
    kv_cache_reports: Tuple[int, ...]
    gpu_blocks: Optional[int]
    cpu_blocks: Optional[int]
    max_model_len: Optional[int]
    kv_cache_dtype: Optional[str]
    max_concurrency: Optional[Dict[str, Any]]
    concurrency_source: str
    checks: Tuple[Check, ...]
    stages_seen: Tuple[str, ...]
    last_event: Optional[LogEvent]
    complete: bool
    failure: Optional[Failure]
    options: Options
    events: Tuple[LogEvent, ...] = ()
    findings: Tuple[Finding, ...] = ()
    recommendations: Tuple[Recommendation, ...] = ()
    engine: str = "vllm"
    verdict: Optional[Any] = None  # agent/verdict.py: the answer first
    summary: Summary = Summary()
    budget: Budget = Budget()
    geometry: Optional[KvGeometry] = None  # bytes per token from --model-config, vLLM's paging
    geometry_note: Optional[str] = None  # why there is none although a config was given

    def logged_bytes_per_token(self) -> Optional[Tuple[float, Worker]]:
        """The binding worker's KV memory ÷ the binding KV report (any era: from 0.21 the token figure is
        concurrency × max_model_len, still blocks × block size for a uniform full-attention model)."""
        w = self.binding()
        if w is None or not w.available_kv_bytes or not self.kv_cache_tokens:
            return None
        return w.available_kv_bytes / self.kv_cache_tokens, w

    @property
    def failed(self) -> Optional[Failure]:
        return self.failure

    def binding(self) -> Optional[Worker]:
        """The worker with the least KV memory: every worker gets the minimum's block count."""
        known = [w for w in self.ranks if w.available_kv_bytes is not None]
        return min(known, key=lambda w: w.available_kv_bytes or 0) if known else None

    def graphs_outside_bytes(self) -> Tuple[int, bool]:
        graphs = [w.cuda_graph_bytes for w in self.ranks if w.cuda_graph_bytes is not None]
        return (max(graphs) if graphs else 0), bool(graphs)

    def default_utilization(self) -> Optional[float]:
        """--gpu-memory-utilization when not given: 0.9, 0.92 from 0.20.0 (config/cache.py); None when the
        log does not say which side of 0.20 it is."""
        if self.era.since is not None and self.era.since >= (0, 20, 0):
            return 0.92
        if self.era.until is not None and self.era.until < (0, 20, 0):
            return 0.9
        return None

    def fixed_kv_size(self, flags: Dict[str, Any]) -> bool:
        """--kv-cache-memory-bytes sets the KV cache directly (any form: vLLM reads "50G" and "8Gi" too,
        arg_utils human_readable_int); then u sizes nothing."""
        return any(source.get("kv_cache_memory_bytes") not in (None, "", "None", False)
                   for source in (flags, self.server_args))

    def fraction(self, flags: Dict[str, Any]) -> Optional[Tuple[float, str]]:
        """(--gpu-memory-utilization, where it comes from): the running server's (its command line, or
        its /metrics cache_config), else the log's, else the era's default; None when none of these says,
        or when --kv-cache-memory-bytes fixes the KV cache instead (then u sizes nothing)."""
        if self.fixed_kv_size(flags):
            return None
        given = _given(flags, "gpu_memory_utilization")
        if given is not None:
            return given, "u {:g} from the running server".format(given)
        w = self.sized_worker()
        if w is not None:
            assert w.gpu_memory_utilization is not None
            return w.gpu_memory_utilization, "u {:g} from the log".format(w.gpu_memory_utilization)
        logged = _given(self.server_args, "gpu_memory_utilization")
        if logged is not None:
            return logged, "u {:g} from the log's arguments".format(logged)
        default = self.default_utilization()
        return None if default is None else (default, "u {:g}, this era's default".format(default))

    def process_ceiling(self, cuda_total: int, flags: Dict[str, Any]) -> Optional[Tuple[int, str, bool]]:
        """(bytes, how, others inside) a worker's process may reach on a GPU whose CUDA total is
        ``cuda_total``: the budget T·u at its activation peak, plus the CUDA graph pool where it sits
        outside the budget (before 0.20, or when the era is unknown: the safe side), plus the CUDA
        context. In 0.6.4.x and V1 ≤ 0.9.0 the budget counts every other process and the context
        inside it (their non-torch figure is the device's whole non-torch use): ``others inside``.
        ``how`` lists the terms as they are subtracted from the GPU's memory."""
        got = self.fraction(flags)
        if got is None:
            return None
        u, src = got
        if self.era.name in ("V0-b", "V1-a"):
            return int(cuda_total * u), "T·u ({}; other processes and the CUDA context are inside it in this " \
                "era)".format(src), True
        ceiling = int(cuda_total * u) + CUDA_CONTEXT_BYTES
        how = "T·u ({}) − the CUDA context (~{} MiB)".format(src, CUDA_CONTEXT_BYTES >> 20)
        graphs, _ = self.graphs_outside_bytes()
        if graphs and self.era.graphs_inside is not True:
            ceiling += graphs
            how += " − the CUDA graph pool outside the budget"
        return ceiling, how, False

    def sized_worker(self) -> Optional[Worker]:
        """The first worker that printed the device total and the fraction (what a new u is sized from)."""
        return next((w for w in self.ranks if w.total_gpu_bytes and w.gpu_memory_utilization is not None), None)

    def utilization_for(self, delta_bytes: int, cuda_total: Optional[int] = None,
                        flags: Optional[Dict[str, Any]] = None) -> Optional[Tuple[float, int]]:
        """(new --gpu-memory-utilization, bytes it moves per worker) for a budget move of about
        ``delta_bytes``: u + delta/T rounded down to 0.01. In every era the budget is T·u, so the
        KV memory moves by the budget's move (0.20+ graphs sit inside it, still a constant). u is
        ``fraction``'s; T is NVML's ``cuda_total`` on a live node, else the log's."""
        got = self.fraction(flags or {})
        w = self.sized_worker()
        total = cuda_total or (w.total_gpu_bytes if w is not None else None)
        if got is None or not total:
            return None
        u = got[0]
        if not delta_bytes:
            return None
        new = math.floor((u + delta_bytes / total) * 100 + 1e-9) / 100
        new = min(max(new, 0.01), 1.0)
        gain = int(round((new - u) * total))
        return (new, gain) if gain else None

    def kv_change(self, delta_bytes: int) -> Optional[KvChange]:
        """The protocol's flag change for a KV budget move, in tokens only where the log gives the
        bytes per token (before 0.21: available KV ÷ GPU KV cache size)."""
        moved = self.utilization_for(delta_bytes)
        cell = self.budget.cell_bytes
        if moved is None or not cell:
            return None
        new, gain = moved
        return KvChange("--gpu-memory-utilization", "{:.2f}".format(new), gain, gain // cell,
                        "rounded down to 0.01 of the device total")

    def headroom(self) -> Tuple[Optional[int], str]:
        """Memory no budget covers after a finished startup: T − T·u − graphs outside the budget − the
        CUDA context (not in the log: the figure measured on a real GPU, CUDA_CONTEXT_BYTES). Only from
        a complete startup whose worker printed T and u."""
        if not self.complete or self.failure is not None:
            return None, ""
        best: Optional[Tuple[int, str]] = None
        for w in self.ranks:
            if w.total_gpu_bytes is None or w.requested_bytes is None:
                continue
            free = w.total_gpu_bytes - w.requested_bytes - CUDA_CONTEXT_BYTES
            how = "total_gpu_memory − the budget ({})".format(w.sources.get("requested_bytes", ""))
            if self.era.graphs_inside is False and w.cuda_graph_bytes is not None:
                free -= w.cuda_graph_bytes
                how += " − the CUDA graph pool outside it ({})".format(w.sources.get("cuda_graph_bytes", ""))
            if best is None or free < best[0]:
                best = (free, how + " − the CUDA context (~{} MiB, not in the log: measured on an H200)".format(
                    CUDA_CONTEXT_BYTES >> 20))
        return best if best is not None else (None, "")

    def engine_warnings(self, kind: str) -> List[Tuple[str, str]]:
        return []


# --- building ------------------------------------------------------------------------------

_WORKER_FIELDS = {
    "total_bytes": "total_gpu_bytes", "utilization": "gpu_memory_utilization", "requested_bytes": "requested_bytes",
    "weights_bytes": "weights_bytes", "non_torch_bytes": "non_torch_bytes", "activation_bytes": "activation_peak_bytes",
    "graph_bytes": "cuda_graph_bytes", "estimate_bytes": "cuda_graph_estimate_bytes",
    "available_kv_bytes": "available_kv_bytes", "free_bytes": "free_at_start_bytes",
}
_WORKER_KINDS = ("weights", "budget", "breakdown", "global_profile", "available_kv", "graph_end", "graph_estimate",
                 "graph_pool", "graph_advisory", "suggestion")


def _workers(events: Tuple[LogEvent, ...]) -> Tuple[Worker, ...]:
    per: Dict[str, Dict[str, Any]] = {}
    order: List[str] = []
    for ev in events:
        is_free_check = ev.kind == "failure" and ev.fmt in ("free_short", "maxlen_v1")
        if ev.kind not in _WORKER_KINDS and not is_free_check:
            continue
        rank = ev.rank or ""
        if rank not in per:
            per[rank] = {"sources": {}}
            order.append(rank)
        w = per[rank]
        for key, value in ev.data.items():
            name = _WORKER_FIELDS.get(key)
            if name is None or value is None:
                continue
            if ev.kind == "breakdown" and key == "weights_bytes":
                continue
            if name == "weights_bytes" and ev.kind != "weights" and "weights_bytes" in w:
                continue  # the weights line's 4 decimals beat a profiling message's 2
            w[name] = value
            w["sources"][name] = "{} ({})".format(where(ev), ev.data.get("header") or ev.fmt)
        if ev.kind == "breakdown" and "weights_bytes" not in w:
            w["weights_bytes"] = ev.data["profile_weights_bytes"]
            w["sources"]["weights_bytes"] = where(ev)
        if ev.kind == "global_profile":
            d = ev.data
            w["requested_bytes"] = int(d["total_bytes"] * d["utilization"])
            w["activation_peak_bytes"] = d["peak_torch_bytes"]  # torch peak, weights included (0.6.4.x)
            w["sources"]["requested_bytes"] = "total_gpu_memory × gpu_memory_utilization ({})".format(where(ev))
    return tuple(Worker(rank=r, **{k: v for k, v in per[r].items()}) for r in order)


def _era(events: Tuple[LogEvent, ...]) -> Era:
    since: Optional[Version] = None
    until: Optional[Version] = None
    clues: List[str] = []
    v1 = any(e.kind in _V1_KINDS or e.fmt in _V1_FMTS or (e.rank or "").startswith(("EngineCore", "Worker_"))
             for e in events)
    v0 = any(e.fmt in _V0_FMTS or (e.kind == "blocks" and e.data.get("cpu_blocks") is not None)
             or (e.rank or "").startswith("VllmWorkerProcess") for e in events)
    for ev in events:
        if ev.kind == "engine_config" and ev.data.get("version"):
            clues.append("{}: engine banner v{}".format(where(ev), ev.data["version"]))
            v1 = v1 or ev.data.get("v1")
            since, until = _banner_bounds(ev.data["version"], since, until)
        row = BY_NAME.get(ev.fmt)
        for clue in row.clues if row else ():
            found = clue(ev.data, ev.text)
            if found is None:
                continue
            lo, hi, why = found
            if lo is not None and (since is None or lo > since):
                since = lo
            if hi is not None and (until is None or hi < until):
                until = hi
            clues.append("{}: {}".format(where(ev), why))
    family = "V1" if v1 and not v0 else ("V0" if v0 and not v1 else None)
    names = [n for n, lo, hi, _ in ERAS if (family is None or n.startswith(family))
             and (since is None or hi >= since) and (until is None or lo <= until)]
    inside = {g for n, lo, hi, g in ERAS if n in names}
    return Era(family, since, until, names[0] if len(names) == 1 else None,
               inside.pop() if len(inside) == 1 else None, tuple(dict.fromkeys(clues)))


def _banner_bounds(text: str, since: Optional[Version], until: Optional[Version]) -> Tuple[Optional[Version],
                                                                                          Optional[Version]]:
    """The banner's own version narrows the era: a release ("0.11.0", "0.6.4.post1") pins it; a
    pre-release or build of the main branch ("0.12.0.dev5+g…", "0.11.0rc2") is only no later."""
    m = re.match(r"(\d{1,4})\.(\d{1,4})\.(\d{1,4})(\.post\d+)?(.*)$", text)
    if m is None:
        return since, until
    v = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    if not m.group(5):
        since = v if since is None or v > since else since
    until = v if until is None or v < until else until
    return since, until


def _order(ev: LogEvent) -> Tuple[int, int]:
    return (ev.offset, ev.line or 0)


def _failure(events: Tuple[LogEvent, ...], workers: Tuple[Worker, ...], stages: List[str],
             last: Optional[LogEvent]) -> Optional[Failure]:
    failures = [e for e in events if e.kind == "failure"]
    exceptions = [e for e in events if e.kind == "exception"]
    if not failures and not exceptions:
        return None
    specific = [e for e in failures if e.data.get("cause") not in GENERIC_CAUSES + ("cuda_out_of_memory",)]
    oom = [e for e in failures if e.data.get("cause") == "cuda_out_of_memory"]
    generic = sorted((e for e in failures if e.data.get("cause") in GENERIC_CAUSES),
                     key=lambda e: GENERIC_CAUSES.index(str(e.data.get("cause"))))
    primary = (specific or oom or generic or exceptions)[0]
    cause = str(primary.data.get("cause", "exception"))
    said = next((e for e in exceptions if _order(e) >= _order(primary) and e.data.get("text")), None)
    message = said.text if said is not None and primary.kind != "exception" and cause in GENERIC_CAUSES \
        else primary.text
    frame_stage = None
    for f in (e for e in events if e.kind == "frame"):
        for funcs, name in _FRAME_STAGE:
            if f.data.get("func") in funcs:
                frame_stage = name
    if cause in GENERIC_CAUSES + ("cuda_out_of_memory",):
        kv = [w.available_kv_bytes for w in workers if w.available_kv_bytes is not None]
        if cause != "cuda_out_of_memory" and kv and min(kv) <= 0:
            cause = "no_kv_memory"
            return Failure(cause, "kv_cache", "the KV figure before it ({} GiB): vLLM raises 'No available memory "
                           "for the cache blocks'".format(round(min(kv) / 2**30, 2)), message, primary.rank or None,
                           primary)
    if cause in _CAUSE_STAGE:
        stage, how = _CAUSE_STAGE[cause], "the message"
    elif frame_stage is not None:
        stage, how = frame_stage, "traceback frames"
    elif "graph_capture" in stages and not any(e.kind == "graph_end" for e in events):
        stage, how = "graph_capture", "a CUDA graph capture began and never finished"
    elif last is not None:
        i = STAGES.index(stages[-1]) if stages else -1
        stage = STAGES[min(i + 1, len(STAGES) - 2)] if i >= 0 else "unknown"
        how = "the last stage the log shows ({}, {})".format(stages[-1] if stages else "none", where(last))
    else:
        stage, how = "unknown", "nothing in the log shows how far it got"
    return Failure(cause, stage, how, message if len(message) <= 300 else message[:297] + "...",
                   primary.rank or None, primary)


def _given(flags: Dict[str, Any], key: str) -> Optional[float]:
    """A positive number a server's settings give for ``key`` (bool, text, NaN and junk are not)."""
    value = flags.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e15:
        return None
    return None if key == "gpu_memory_utilization" and value > 1 else float(value)


def _geometry(cfg: Optional[Dict[str, Any]], args: Dict[str, Any],
              era: Era) -> Tuple[Optional[KvGeometry], Optional[str]]:
    if not cfg:
        return None, None

    def size(key: str) -> int:
        value = args.get(key)
        return value if isinstance(value, int) and 0 < value <= 4096 else 1

    try:
        reads = True if era.since and era.since >= (0, 14, 0) else (
            False if era.until and era.until < (0, 14, 0) else None)
        return kv_geometry.geometry(cfg, size("tensor_parallel_size"), args.get("kv_cache_dtype"),
                                    size("pipeline_parallel_size"), reads), None
    except GeometryError as exc:
        return None, str(exc)


def build_analysis(startup: Startup, target: str, opts: Options, index: Optional[int] = None,
                   count: Optional[int] = None, reader_notes: Tuple[str, ...] = (),
                   fallback_args: Optional[Dict[str, Any]] = None) -> Analysis:
    """``fallback_args``: the live server's command-line flags, for what the log does not print."""
    events = startup.events
    problems: List[Problem] = [Problem("log.reader", note) for note in reader_notes]
    workers = _workers(events)
    era = _era(events)
    args: Dict[str, Any] = {}
    for ev in events:
        if ev.kind == "args":
            args.update(ev.data["args"])
        elif ev.kind == "engine_config":
            args.update({k: ev.data[k] for k in ("max_model_len", "kv_cache_dtype", "tensor_parallel_size",
                                                 "pipeline_parallel_size") if ev.data.get(k) is not None})
        elif ev.kind == "kv_dtype":
            args.setdefault("kv_cache_dtype", ev.data["kv_cache_dtype"])
    for key, value in (fallback_args or {}).items():
        args.setdefault(key, value)
    tokens_evs = [e for e in events if e.kind == "kv_tokens" and e.data.get("tokens") is not None]
    reports = tuple(e.data["tokens"] for e in tokens_evs)
    blocks_ev = next((e for e in events if e.kind == "blocks"), None)
    # Before 0.12 every worker prints its own line; vLLM then gives every worker the smallest block
    # count (kv_cache_utils.py get_kv_cache_configs / unify_kv_cache_configs), so the least binds.
    conc_evs = [e for e in events if e.kind == "concurrency" and e.data and e.data.get("times") is not None]
    conc_ev = min(conc_evs, key=lambda e: e.data["times"], default=None)
    conc = dict(conc_ev.data) if conc_ev else None
    if conc is None:
        merged = next((e for e in tokens_evs if e.data.get("concurrency")), None)
        conc_ev, conc = (merged, dict(merged.data["concurrency"])) if merged else (None, None)
    if conc is not None:
        conc.pop("header", None)
        conc.pop("repeated", None)
    maxlen = args.get("max_model_len") or (conc["tokens_per_request"] if conc else None)
    failed_len = next((e.data["max_model_len"] for e in events if e.kind == "failure"
                       and e.data.get("cause") == "max_model_len_too_large"), None)
    maxlen = failed_len or maxlen
    stages: List[str] = []
    last: Optional[LogEvent] = None
    for ev in events:
        st = _STAGE_OF_KIND.get(ev.kind)
        if st is None:
            continue
        if st not in stages:
            stages.append(st)
        last = ev
    complete = startup.closed and not any(e.kind in ("failure", "exception") for e in events)
    died = _failure(events, workers, stages, last) if not (complete and "ready" in stages) else None
    if died is not None:
        complete = False
    binding_kv = [w.available_kv_bytes for w in workers if w.available_kv_bytes is not None]
    cell = None
    tokens = min(reports) if reports else None
    if tokens and binding_kv and min(binding_kv) > 0 and not (era.since and era.since >= (0, 21, 0)):
        cell = int(min(binding_kv) / tokens)
    checks = tuple(_checks(workers, events, era))
    geo, geo_note = _geometry(opts.model_config, args, era)
    if not complete and died is None:
        problems.append(Problem("log.fragment", "the log stops before the engine finished starting (last stage: {})"
                                .format(STAGE_WORDS.get(stages[-1], "none") if stages else "none")))
    if not workers:
        problems.append(Problem("log.no_ranks", "no per-worker memory lines in this startup"))
    if era.conflicting:
        problems.append(Problem("log.version_conflict", "the log's release clues contradict each other ({}; "
                                "engine.version_clues lists them): lines of two releases in one startup, or an "
                                "edited log; the era is left open".format(era.hint)))
    return Analysis(
        target, "ok" if complete or died is not None else "partial", tuple(problems), era, args, index, count,
        startup.first_line, workers, tokens, reports, blocks_ev.data["gpu_blocks"] if blocks_ev else None,
        blocks_ev.data.get("cpu_blocks") if blocks_ev else None, maxlen,
        args.get("kv_cache_dtype"), conc, where(conc_ev) if conc_ev else "", checks, tuple(stages), last,
        complete, died, opts, events, budget=Budget(cell),
        geometry=geo, geometry_note=geo_note,
        # The shared protocol's pool and length: the binding KV report and max_model_len (vLLM prints
        # no request-slot count; --max-num-seqs is a flag, not a log line).
        summary=Summary(tokens, None, maxlen, where(tokens_evs[reports.index(tokens)]) if tokens is not None else ""))


def _checks(workers: Tuple[Worker, ...], events: Tuple[LogEvent, ...], era: Era) -> List[Check]:
    out: List[Check] = []
    for ev in events:
        d = ev.data
        rank = ev.rank or ""
        if ev.kind == "breakdown":
            budget = next((e for e in events if e.kind == "budget" and (e.rank or "") == rank), None)
            if budget is None:
                continue
            pred = budget.data["requested_bytes"] - d["profile_weights_bytes"] - d["non_torch_bytes"] \
                - d["activation_bytes"]
            out.append(Check(rank, "total_gpu_memory × gpu_memory_utilization − weights − non_torch − activation peak "
                             "(vLLM 0.6.5–0.10.2 worker.py determine_num_available_blocks)", pred,
                             d["available_kv_bytes"], 4 * PRINT_TOLERANCE_BYTES, (where(budget), where(ev))))
        elif ev.kind == "global_profile":
            pred = int(d["total_bytes"] * d["utilization"]) - d["peak_torch_bytes"] - d["non_torch_bytes"]
            out.append(Check(rank, "total_gpu_memory × gpu_memory_utilization − peak_torch − non_torch (vLLM 0.6.4.x "
                             "worker.py determine_num_available_blocks)", pred, d["available_kv_bytes"],
                             4 * PRINT_TOLERANCE_BYTES, (where(ev),)))
        elif ev.kind == "suggestion" and d.get("consumed_bytes") is not None and d.get("activation_bytes") is not None:
            pred = d["requested_bytes"] - d["consumed_bytes"] - d["activation_bytes"]
            out.append(Check(rank, "requested − consumed (weights + non-torch) − peak activation (with the CUDA graph "
                             "estimate) (vLLM 0.27+ gpu_worker.py determine_available_memory)", pred,
                             d.get("available_kv_bytes"), 4 * PRINT_TOLERANCE_BYTES, (where(ev),)))
    return out
