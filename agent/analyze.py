"""A startup's full analysis: the engine's model, then the rule book's findings and advice.

The one entry point for every caller that has a startup (``analyze``, ``inspect``, ``record``);
it is the place that will pick the engine once there are several.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Optional, Tuple

from agent import rulebook
from agent.records import Options
from agent.sglang.analysis import Analysis, build_analysis
from agent.verdict import verdict
from collectors.sglang.startups import Startup


def analyze_startup(startup: Startup, target: str, opts: Options, index: Optional[int] = None,
                    count: Optional[int] = None, reader_notes: Tuple[str, ...] = (),
                    fallback_args: Optional[Dict[str, Any]] = None) -> Analysis:
    analysis = build_analysis(startup, target, opts, index, count, reader_notes, fallback_args)
    ctx = rulebook.Context.offline(analysis)
    findings, recommendations = rulebook.findings(ctx), rulebook.recommendations(ctx)
    return replace(analysis, findings=tuple(findings), recommendations=tuple(recommendations),
                   verdict=verdict(analysis, False, findings, recommendations))
