"""What the model needs to know of an engine: one descriptor per engine, one registry.

Each engine's folder (``agent/<name>/plugin.py``) exports ``ENGINE = EngineModel(...)``: how its
startup is analysed, its rules and recommenders, how its workers are placed on GPUs, and the few
facts the engine-neutral node rules need (its budget flag, its load metrics, what its budget
means). The neutral code (agent/model/analyze.py, reconcile.py, rulebook.py, node_rules.py, record.py)
reads engines only through this registry, never by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Protocol, Tuple

from kvforensics.agent.model.records import Finding, Options, Problem, Recommendation
from kvforensics.collectors.plugin import ENGINES as COLLECTORS
from kvforensics.collectors.registry import Registry, UnknownEngine

__all__ = ["ENGINES", "EngineAnalysis", "EngineModel", "LoadMetrics", "UnknownEngine", "display"]


class EngineAnalysis(Protocol):
    """What every engine's startup analysis has: the rule book, the verdict and the renderers read
    these fields and nothing engine-specific (an engine's own rules read the rest of its record)."""

    engine: str  # the registry key of the engine whose log it is
    target: str
    status: str  # "ok" | "partial"
    problems: Tuple[Problem, ...]
    era: Any
    server_args: Dict[str, Any]
    startup_index: Optional[int]
    startup_count: Optional[int]
    startup_first_line: Optional[int]
    options: Options
    findings: Tuple[Finding, ...]
    recommendations: Tuple[Recommendation, ...]
    verdict: Optional[Any]
    summary: Any  # max_total_num_tokens, max_running_requests, context_len, source: what bounds concurrency
    budget: Any  # cell_bytes: KV bytes per token, or None
    ranks: Tuple[Any, ...]  # each with .rank and .target.kv_bytes (the KV pool the log gives it)

    @property
    def failed(self) -> Optional[Any]: ...  # noqa: E704 - the failure that ended the startup, if any

    @property
    def complete(self) -> bool: ...  # noqa: E704 - the startup reached its end: figures are "after startup"

    def headroom(self) -> Tuple[Optional[int], str]: ...  # noqa: E704 - free bytes after startup, and its source

    # the flag change that moves the KV budget by about delta; on a live node with the GPU's CUDA total
    # (NVML total − reserved) and the running server's flags, for an engine whose budget they size
    def kv_change(self, delta: int, cuda_total: Optional[int] = None,
                  flags: Optional[Dict[str, Any]] = None) -> Optional[Any]: ...  # noqa: E704

    # (why, action) when kv_change gives none: a margin beyond the GPU, a cut that would leave no KV
    # cache, a log that lacks the budget's inputs; ("", "") when it gives one, or when nothing needs saying
    def why_no_kv_change(self, delta: int, live: bool, cuda_total: Optional[int] = None,
                         flags: Optional[Dict[str, Any]] = None) -> Tuple[str, str]: ...  # noqa: E704


@dataclass(frozen=True)
class LoadMetrics:
    """Where the engine's /metrics says how loaded it is (agent/history/record.py, the concurrency finding)."""

    running: str  # requests being served
    queued: str  # requests waiting for room
    kv_usage: Tuple[str, ...]  # share of the KV cache in use, 0–1: the first one present counts
    used_tokens: Optional[str] = None  # KV tokens in use, where the engine counts tokens
    shown: Tuple[Tuple[str, str, str], ...] = ()  # (metric, label, format) beside a concurrency finding

    def read(self, metrics: Mapping[str, float]) -> Dict[str, Optional[float]]:
        usage = next((metrics[k] for k in self.kv_usage if k in metrics), None)
        return {"running": metrics.get(self.running), "queued": metrics.get(self.queued), "kv_usage": usage,
                "used_tokens": metrics.get(self.used_tokens) if self.used_tokens else None}


AnalysisRule = Callable[[Any], Iterable[Finding]]
ContextRule = Callable[[Any], Iterable[Finding]]  # over agent/model/context.py Context
Recommender = Callable[[Any], Iterable[Recommendation]]


@dataclass(frozen=True)
class EngineModel:
    """One engine, as the forensics model sees it."""

    name: str  # the same key as its collectors' plug-in
    # (startup, target, options, index, count, reader notes, fallback server args) → its analysis
    build_analysis: Callable[..., EngineAnalysis]
    headlines: Tuple[AnalysisRule, ...]  # the truth about the startup itself: they open the report
    rules: Tuple[AnalysisRule, ...]  # over its startup analysis
    recommenders: Tuple[Recommender, ...]  # over the Context
    # (engine, analysis or None, {pid: GPU index}) → {pid: (rank label, ledger items)}
    place: Callable[[Any, Optional[Any], Dict[int, int]], Dict[int, Any]]
    budget_flag: str  # the flag that sizes its KV budget
    load: LoadMetrics
    process_hint: Tuple[str, ...]  # the command lines it is found by, for "no server on this node"
    # Its budget is a share of the GPU's total, whatever else runs (so a process beside a worker
    # does not shrink it, and only its own workers' spread leaves memory unused) ...
    budget_of_total: bool = False
    # ... and holds a peak it frees between peaks: without its log, NVML's free memory is not spare.
    frees_profiled_peak: bool = False
    # (context, GPU process, engine GPUs, bytes per KV token or None) → what the process costs the engine
    foreign_cost: Callable[[Any, Any, int, Optional[int]], str] = lambda ctx, p, gpus, cell: ""
    # Live rules of its own (e.g. a host-RAM cache tier), run after the engine-neutral ones.
    node_rules: Tuple[ContextRule, ...] = ()
    # The startup's own imbalance rule (offline: from its log), or None.
    log_imbalance: Optional[ContextRule] = None


ENGINES: "Registry[EngineModel]" = Registry("kvforensics.agent")


def display(name: Optional[str], default: str = "the engine") -> str:
    """How people write an engine's name (its collectors' plug-in says)."""
    engine = COLLECTORS.find(name)
    return engine.display if engine is not None else default
