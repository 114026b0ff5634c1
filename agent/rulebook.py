"""The rule book: every finding and every recommendation comes from here, offline and live.

A rule is a small function of a ``Context`` — the engine's startup analysis, and when there is
one, the live node (NVML ledger, processes, metrics) and its recorded history — that yields
findings. The same rule serves a pasted log and a live node: it measures when it can (live
NVML, the run's low-water mark) and reads the startup's own figures otherwise. Report order:
the headlines (the startup failed, or the log is a fragment), then by severity, then the order
of ``RULES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional

from agent import node_rules
from agent.live import Inspection
from agent.records import Finding, Options, Recommendation, most_severe_first
from agent.sglang import recommend as sglang_recommend
from agent.sglang import rules as sglang_rules
from agent.vllm import recommend as vllm_recommend
from agent.vllm import rules as vllm_rules


@dataclass(frozen=True)
class Context:
    """What the rules see. ``analysis`` is None when no startup log could be read."""

    analysis: Optional[object]
    options: Options
    live: Optional[Inspection] = None

    @classmethod
    def offline(cls, analysis: object) -> "Context":
        return cls(analysis, analysis.options)  # type: ignore[attr-defined]

    @classmethod
    def on_node(cls, insp: Inspection) -> "Context":
        return cls(insp.analysis, insp.options, insp)

    @property
    def history(self) -> Optional[object]:
        return self.live.history if self.live is not None else None


Rule = Callable[[Context], Iterable[Finding]]
Recommender = Callable[[Context], Iterable[Recommendation]]


def _engine(a: object) -> str:
    return getattr(a, "engine", "sglang")


def _on_startup(rule: Callable[[object], Iterable[Finding]], engine: str = "sglang") -> Rule:
    """An engine rule over the startup analysis alone: silent without one, or on another engine's."""
    def run(ctx: Context) -> Iterable[Finding]:
        return rule(ctx.analysis) if ctx.analysis is not None and _engine(ctx.analysis) == engine else ()
    run.__name__ = getattr(rule, "__name__", "rule")
    return run


def _for_engine(rec: Recommender, engine: str) -> Recommender:
    def run(ctx: Context) -> Iterable[Recommendation]:
        return rec(ctx) if ctx.analysis is None or _engine(ctx.analysis) == engine else ()
    run.__name__ = getattr(rec, "__name__", "recommender")
    return run


# The truth about the startup itself (failed, or only a fragment) opens the report, whatever
# the severities below it.
HEADLINES: List[Rule] = [_on_startup(r) for r in sglang_rules.HEADLINES] + [
    _on_startup(r, "vllm") for r in vllm_rules.HEADLINES]

RULES: List[Rule] = [
    node_rules.nvml_unavailable, node_rules.gpu_lost, node_rules.engine_not_found, node_rules.engine_log_missing,
    *[_on_startup(r) for r in sglang_rules.RULES],
    *[_on_startup(r, "vllm") for r in vllm_rules.RULES],
    node_rules.unused_gpu_memory, node_rules.foreign_gpu_process, node_rules.orphaned_gpu_memory,
    node_rules.other_pid_namespace,
    node_rules.rank_imbalance, node_rules.concurrency_bound, node_rules.host_ram_offload, node_rules.other_engines,
]

RECOMMENDERS: List[Recommender] = [_for_engine(r, "sglang") for r in sglang_recommend.RECOMMENDERS] + [
    _for_engine(r, "vllm") for r in vllm_recommend.RECOMMENDERS]


def findings(ctx: Context) -> List[Finding]:
    first = [f for rule in HEADLINES for f in rule(ctx)]
    rest: List[Finding] = []
    for rule in RULES:
        rest.extend(rule(ctx))
    # On a live node, what bounds concurrency is shown beside the load now (any engine's finding).
    rest = [node_rules.with_live_load(ctx, f) if f.code == "concurrency_bound" else f for f in rest]
    return first + most_severe_first(rest)


def recommendations(ctx: Context) -> List[Recommendation]:
    out: List[Recommendation] = []
    for rec in RECOMMENDERS:
        out.extend(rec(ctx))
    return out
