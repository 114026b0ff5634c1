"""The rule book: every finding and every recommendation comes from here, offline and live.

A rule is a small function of a ``Context`` (agent/model/context.py) — the engine's startup analysis,
and when there is one, the live node (NVML ledger, processes, metrics) and its recorded history —
that yields findings. The same rule serves a pasted log and a live node: it measures when it can
(live NVML, the run's low-water mark) and reads the startup's own figures otherwise. Report order:
the headlines (the startup failed, or the log is a fragment), then by severity, then rule order:
the node's own rules, each engine's startup rules (agent/<engine>/plugin.py, in registry order),
the questions every engine answers, each engine's node rules, and the other servers last.
"""

from __future__ import annotations

from typing import Callable, Iterable, List

from kvforensics.agent.model import node_rules
from kvforensics.agent.model.context import Context
from kvforensics.agent.model.records import Finding, Recommendation
from kvforensics.agent.model.severity import most_severe_first
from kvforensics.agent.plugin import ENGINES, EngineModel

__all__ = ["Context", "findings", "recommendations"]

Rule = Callable[[Context], Iterable[Finding]]
Recommender = Callable[[Context], Iterable[Recommendation]]


def _named(name: object) -> List[EngineModel]:
    """The engine of that name alone (no other engine's modules imported), or none."""
    engine = ENGINES.find(name)
    return [engine] if engine is not None else []


def _mine(ctx: Context) -> List[EngineModel]:
    return _named(ctx.analysis.engine) if ctx.analysis is not None else []


def _startup_findings(ctx: Context, which: str) -> List[Finding]:
    """An engine's rules over its startup analysis: silent without one, or on another engine's."""
    return [f for e in _mine(ctx) for rule in getattr(e, which) for f in rule(ctx.analysis)]


def _engine_node_findings(ctx: Context) -> List[Finding]:
    return [f for e in _named(ctx.engine_kind) for rule in e.node_rules for f in rule(ctx)]


NODE_FIRST: List[Rule] = [node_rules.nvml_unavailable, node_rules.gpu_lost, node_rules.engine_not_found,
                          node_rules.engine_log_missing]
COMMON: List[Rule] = [node_rules.unused_gpu_memory, node_rules.foreign_gpu_process, node_rules.orphaned_gpu_memory,
                      node_rules.other_pid_namespace, node_rules.rank_imbalance, node_rules.concurrency_bound]
LAST: List[Rule] = [node_rules.other_engines]


def findings(ctx: Context) -> List[Finding]:
    # The truth about the startup itself (failed, or only a fragment) opens the report, whatever
    # the severities below it.
    first = _startup_findings(ctx, "headlines")
    rest: List[Finding] = [f for rule in NODE_FIRST for f in rule(ctx)]
    rest += _startup_findings(ctx, "rules")
    rest += [f for rule in COMMON for f in rule(ctx)]
    rest += _engine_node_findings(ctx)
    rest += [f for rule in LAST for f in rule(ctx)]
    # On a live node, what bounds concurrency is shown beside the load now (any engine's finding).
    rest = [node_rules.with_live_load(ctx, f) if f.code == "concurrency_bound" else f for f in rest]
    return first + most_severe_first(rest)


def recommendations(ctx: Context) -> List[Recommendation]:
    """The explained engine's recommenders: the log's engine, else the live node's (they read the live node);
    none on a node without an engine, whose recommenders are then never imported."""
    engines = _named(ctx.engine_kind) if ctx.analysis is None else _mine(ctx)
    return [r for e in engines for rec in e.recommenders for r in rec(ctx)]
