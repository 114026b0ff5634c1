"""A toy engine defined only here, to prove the plug-in: three descriptors (collectors, model,
renderers) registered through the same registries as the real engines, and nothing else.

Its log: ``[toyllm] kv cache 10.00 GiB for 40960 tokens, budget 12.50 GiB`` then ``[toyllm] ready``.
Its one rule: the KV cache's share of the budget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from kvforensics.agent.model.records import Finding, Options, Problem
from kvforensics.agent.plugin import ENGINES as MODELS
from kvforensics.agent.plugin import EngineModel, LoadMetrics
from kvforensics.collectors import lineformat
from kvforensics.collectors.events import EngineStartup, LogEvent, segment
from kvforensics.collectors.plugin import ENGINES as COLLECTORS
from kvforensics.collectors.plugin import EngineCollectors
from kvforensics.reports.plugin import VIEWS, EngineView

NAME = "toyllm"
GIB = 1 << 30

# --- collectors -----------------------------------------------------------------------------

FORMATS = (
    lineformat.LineFormat("toy_kv", "toy_kv", "kv cache ",
                          re.compile(r"^kv cache (?P<kv>\d{1,6}\.\d{2}) GiB for (?P<tokens>\d{1,12}) tokens, "
                                     r"budget (?P<budget>\d{1,6}\.\d{2}) GiB$"),
                          lambda m, msg: {"kv_bytes": int(float(m.group("kv")) * GIB),
                                          "tokens": int(m.group("tokens")),
                                          "budget_bytes": int(float(m.group("budget")) * GIB)}),
    lineformat.LineFormat("toy_ready", "toy_ready", "ready", re.compile(r"^ready$"), lambda m, msg: {}),
)
_PREFIX = "[toyllm] "


def parse_line(raw: str, line: Optional[int] = None, offset: int = 0) -> List[LogEvent]:
    if not raw.startswith(_PREFIX):
        return []
    msg = raw[len(_PREFIX):].rstrip("\n")
    found = lineformat.match(FORMATS, msg)
    if found is None:
        return []
    row, data = found
    return [LogEvent(row.kind, line, offset, "", None, data, msg, raw, row.name)]


@dataclass(frozen=True)
class ToyStartup(EngineStartup):
    engine: str = NAME


class Segmenter:
    """A startup opens at its KV line and closes at ``ready``."""

    def __init__(self, keep: Optional[int] = None) -> None:
        self._startups: List[List[LogEvent]] = []
        self._closed: List[bool] = []

    @property
    def current_closed(self) -> bool:
        return bool(self._closed) and self._closed[-1]

    def feed(self, ev: LogEvent) -> None:
        if ev.kind == "toy_kv" or not self._startups:
            self._startups.append([])
            self._closed.append(False)
        self._startups[-1].append(ev)
        if ev.kind == "toy_ready":
            self._closed[-1] = True

    def result(self) -> List[ToyStartup]:
        return [ToyStartup(tuple(evs), closed) for evs, closed in zip(self._startups, self._closed)]


def segment_lines(rows: Iterable[Tuple[Optional[int], int, str]]) -> List[ToyStartup]:
    return segment(rows, parse_line, Segmenter())


COLLECTOR = EngineCollectors(
    name=NAME, display="ToyLLM", formats=FORMATS, idle_needles=(), parse_line=parse_line, segmenter=Segmenter,
    segment_lines=segment_lines, anchors=(b"[toyllm] kv cache",), anchors_in_order=True,
    anchor_words="'kv cache'", end_words="'ready'", no_startup_hint="'kv cache'", launch_lines=(b"[toyllm] kv",),
    owns_event=lambda ev: True, begins_cleanly=lambda startup, start, back: True,
    classify=lambda argv: {"role": "server", "launch": "toyllm", "flags_at": 1} if argv[:1] == ["toyllm"] else None,
    parse_flags=lambda argv: {}, default_port=7777, read_http=lambda base, section: False)

# --- model ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToySummary:
    max_total_num_tokens: Optional[int] = None
    max_running_requests: Optional[int] = None
    context_len: Optional[int] = None
    source: str = ""


@dataclass(frozen=True)
class ToyBudget:
    cell_bytes: Optional[int] = None


@dataclass(frozen=True)
class ToyRunner:
    kv_bytes: Optional[int]


@dataclass(frozen=True)
class ToyRank:
    rank: str
    target: ToyRunner


@dataclass(frozen=True)
class ToyEra:
    hint: str = "toy 1.0"
    name: str = "toy"
    clues: Tuple[str, ...] = ()


@dataclass(frozen=True)
class ToyAnalysis:
    target: str
    status: str
    problems: Tuple[Problem, ...]
    server_args: Dict[str, Any]
    startup_index: Optional[int]
    startup_count: Optional[int]
    startup_first_line: Optional[int]
    options: Options
    kv_bytes: int
    budget_bytes: int
    summary: ToySummary
    budget: ToyBudget
    ranks: Tuple[ToyRank, ...]
    complete: bool
    era: ToyEra = field(default_factory=ToyEra)
    findings: Tuple[Finding, ...] = ()
    recommendations: Tuple[Any, ...] = ()
    verdict: Optional[Any] = None
    engine: str = NAME

    @property
    def failed(self) -> None:
        return None

    def headroom(self) -> Tuple[Optional[int], str]:
        return None, ""

    def kv_change(self, delta: int, cuda_total: Optional[int] = None, flags: Optional[Dict[str, Any]] = None) -> None:
        return None

    def why_no_kv_change(self, delta: int, live: bool, cuda_total: Optional[int] = None,
                         flags: Optional[Dict[str, Any]] = None) -> Tuple[str, str]:
        return "", ""


def build_analysis(startup: ToyStartup, target: str, opts: Options, index: Optional[int], count: Optional[int],
                   reader_notes: Tuple[str, ...], fallback_args: Optional[Dict[str, Any]]) -> ToyAnalysis:
    kv = next(ev for ev in startup.events if ev.kind == "toy_kv")
    tokens = kv.data["tokens"]
    return ToyAnalysis(
        target=target, status="ok" if startup.closed else "partial", problems=(), server_args={},
        startup_index=index, startup_count=count, startup_first_line=startup.first_line, options=opts,
        kv_bytes=kv.data["kv_bytes"], budget_bytes=kv.data["budget_bytes"],
        summary=ToySummary(max_total_num_tokens=tokens, source="line {}".format(kv.line)),
        budget=ToyBudget(cell_bytes=kv.data["kv_bytes"] // tokens if tokens else None),
        ranks=(ToyRank("", ToyRunner(kv.data["kv_bytes"])),), complete=startup.closed)


def kv_share(a: ToyAnalysis) -> Iterable[Finding]:
    share = a.kv_bytes / a.budget_bytes if a.budget_bytes else 0.0
    yield Finding("toy_kv_share", "warning", "ToyLLM's KV cache is {:.0%} of its budget".format(share),
                  "kv cache {} B of a {} B budget".format(a.kv_bytes, a.budget_bytes), a.kv_bytes,
                  (a.summary.source,))


MODEL = EngineModel(
    name=NAME, build_analysis=build_analysis, headlines=(), rules=(kv_share,), recommenders=(),
    place=lambda engine, analysis, gpu_of: {}, budget_flag="--toy-budget",
    load=LoadMetrics(running="toy:running", queued="toy:queued", kv_usage=("toy:kv_usage",)),
    process_hint=("`toyllm`",))

# --- renderers ------------------------------------------------------------------------------


def render_terminal(c: Any, a: ToyAnalysis) -> None:
    from kvforensics.reports.terminal import gib_cell, say

    say(c, "ToyLLM: KV cache {} GiB of a {} GiB budget".format(gib_cell(a.kv_bytes), gib_cell(a.budget_bytes)))


def json_target(a: ToyAnalysis) -> Dict[str, Any]:
    from kvforensics.reports.json_report import finding_dict, verdict_dict

    return {"target": a.target, "status": a.status, "problems": [],
            "engine": {"name": NAME, "version_hint": a.era.hint, "version_clues": [], "server_args": {}},
            "startup": {"index": a.startup_index, "count": a.startup_count, "first_line": a.startup_first_line},
            "findings": [finding_dict(f) for f in a.findings], "recommendations": [],
            "verdict": verdict_dict(a.verdict)}


def brief(a: ToyAnalysis) -> List[str]:
    from kvforensics.reports.terminal import gib_cell

    return ["ToyLLM {} · KV cache {} GiB · budget {} GiB".format(a.era.hint, gib_cell(a.kv_bytes),
                                                                gib_cell(a.budget_bytes))]


VIEW = EngineView(name=NAME, terminal=render_terminal, json_target=json_target, brief=brief)


def register() -> None:
    COLLECTORS.register(COLLECTOR)
    MODELS.register(MODEL)
    VIEWS.register(VIEW)


def unregister() -> None:
    for registry in (COLLECTORS, MODELS, VIEWS):
        registry.unregister(NAME)
