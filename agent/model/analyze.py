"""A startup's full analysis: the engine's model, then the rule book's findings and advice.

The one entry point for every caller that has a startup (``analyze``, ``inspect``, ``record``);
it picks the engine the startup was read as (its plug-in, agent/plugin.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Optional, Tuple

from kvforensics.agent.model import rulebook
from kvforensics.agent.model.records import Options
from kvforensics.agent.model.verdict import verdict
from kvforensics.agent.plugin import ENGINES, EngineAnalysis
from kvforensics.collectors.events import EngineStartup


def analyze_startup(startup: EngineStartup, target: str, opts: Options, index: Optional[int] = None,
                    count: Optional[int] = None, reader_notes: Tuple[str, ...] = (),
                    fallback_args: Optional[Dict[str, Any]] = None) -> EngineAnalysis:
    build = ENGINES.get(startup.engine).build_analysis
    analysis: Any = build(startup, target, opts, index, count, reader_notes, fallback_args)
    ctx = rulebook.Context.offline(analysis)
    findings, recommendations = rulebook.findings(ctx), rulebook.recommendations(ctx)
    return replace(analysis, findings=tuple(findings), recommendations=tuple(recommendations),
                   verdict=verdict(analysis, False, findings, recommendations))
