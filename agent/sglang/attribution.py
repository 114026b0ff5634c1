"""Attribute a startup's events to ranks and, within a rank, to the target or draft runner.

Lines are grouped by their rank tag as printed, never by order across ranks: scheduler
processes write concurrently and their lines interleave. Within a rank the draft runner is
told apart by order (research §1.2): the second ``Init … begin``/``Load weight begin``/
``Load weight end`` belongs to the draft. KV-pool and ``Memory pool end`` lines go to the
target until it has its own (0.5.14+ loads both models before either pool), then to the
draft. Graph lines carry their runner in the text ("draft", "draft extend").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from kvforensics.collectors.events import LogEvent
from kvforensics.collectors.sglang.startups import Startup

RUNNER_KINDS = ("dist_init_begin", "dist_init_end", "load_begin", "load_end", "kv_pool", "swa_pool",
                "pool_end", "mamba_pool", "graph_begin", "graph_end", "graph_bs", "graph_progress", "post_capture_kv")


@dataclass
class RunnerEvents:
    """One model runner's (target or draft) events on one rank, in log order."""

    events: List[LogEvent] = field(default_factory=list)

    def first(self, kind: str) -> Optional[LogEvent]:
        return next((e for e in self.events if e.kind == kind), None)

    def all(self, kind: str) -> List[LogEvent]:
        return [e for e in self.events if e.kind == kind]

    def has(self, kind: str) -> bool:
        return any(e.kind == kind for e in self.events)


@dataclass
class RankEvents:
    """One rank's events (by its tag as printed), split between its target and draft runners."""

    rank: str
    target: RunnerEvents = field(default_factory=RunnerEvents)
    draft: RunnerEvents = field(default_factory=RunnerEvents)
    # "Use sliding window memory pool. full_layer_tokens=F, swa_layer_tokens=S": the hybrid pool's two counts.
    swa_split: Optional[LogEvent] = None

    @property
    def has_draft(self) -> bool:
        return bool(self.draft.events)


@dataclass(frozen=True)
class Attributed:
    """A startup's events, split into per-rank runners and startup-wide records."""

    ranks: Tuple[RankEvents, ...]
    server_args: Optional[LogEvent]
    summaries: Tuple[LogEvent, ...]
    failures: Tuple[LogEvent, ...]
    other: Tuple[LogEvent, ...]  # warnings, HiCache, dtype, SWA split, VLM adjustments


def attribute(startup: Startup) -> Attributed:
    ranks: Dict[str, RankEvents] = {}
    server_args = None
    summaries: List[LogEvent] = []
    failures: List[LogEvent] = []
    other: List[LogEvent] = []
    splits: Dict[Optional[str], LogEvent] = {}  # per rank tag; None: the last one, for ranks that print none
    capturing = ""  # the rank whose graph capture began last
    for ev in startup.events:
        if ev.kind == "server_args":
            server_args = server_args or ev
        elif ev.kind == "summary":
            summaries.append(ev)
        elif ev.kind == "failure":
            failures.append(ev)
        elif ev.kind in RUNNER_KINDS:
            # A memory line without any SGLang prefix was pasted with it stripped: untagged. A capture's tqdm
            # progress is always bare: it is the rank's whose capture (or batch-size list) came last.
            tag = ev.rank if ev.rank is not None else (capturing if ev.kind == "graph_progress" else "")
            if ev.kind in ("graph_begin", "graph_bs"):
                capturing = tag
            rank = ranks.setdefault(tag, RankEvents(tag))
            rank.swa_split = splits.get(tag, splits.get(None))
            _runner_for(rank, ev).events.append(ev)
        else:
            if ev.kind == "swa_split" and ev.data.get("full_tokens"):
                splits[ev.rank or ""] = splits[None] = ev
            other.append(ev)
    ordered = tuple(sorted(ranks.values(), key=lambda r: _rank_sort_key(r.rank)))
    return Attributed(ranks=ordered, server_args=server_args, summaries=tuple(summaries), failures=tuple(failures),
                      other=tuple(other))


def _runner_for(rank: RankEvents, ev: LogEvent) -> RunnerEvents:
    """The runner a line belongs to: the target's, unless its text or the lines before it on this
    rank say it is the draft's."""
    t, d = rank.target, rank.draft
    kind = ev.kind
    if kind in ("graph_begin", "graph_end", "post_capture_kv"):
        return d if ev.data.get("draft") else t  # the text names the draft ("draft", "draft extend")
    if kind in ("graph_bs", "graph_progress"):
        return d if d.has("graph_begin") else t
    if kind in ("dist_init_begin", "load_begin"):
        return d if t.has(kind) else t  # the second one on a rank is the draft's
    if kind in ("dist_init_end", "load_end"):
        return _end_runner(rank, ev)
    if kind in ("kv_pool", "swa_pool", "pool_end", "mamba_pool"):
        return _pool_runner(rank, ev)
    return t


def _end_runner(rank: RankEvents, ev: LogEvent) -> RunnerEvents:
    """An init or weights end: the draft's once the draft began that step, once the target has its
    own end line, or when the model it loaded names itself a draft."""
    begin = "dist_init_begin" if ev.kind == "dist_init_end" else "load_begin"
    if rank.draft.has(begin) or rank.target.has(ev.kind) or _is_draft_model(ev):
        return rank.draft
    return rank.target


def _pool_runner(rank: RankEvents, ev: LogEvent) -> RunnerEvents:
    """A pool line goes to the target until it has its own (0.5.14+ loads both models before either
    pool), then to the draft, once the draft has begun loading."""
    t, d = rank.target, rank.draft
    if ev.kind == "kv_pool":
        # Hybrid models print one KV pool line per pool: the target's is taken per pool. Its pools end with
        # one 'Memory pool end' (model_runner.py init_memory_pool): a KV line after it is the draft runner's
        # own pool, even in a fragment that starts after the draft began loading (a 2026 hybrid GDN model
        # with a draft: target K+V 3.46+3.46 GB, then the draft's 1.08+1.08 GB, each with its pool end).
        key = pool_key(ev, rank.swa_split)
        taken = any(pool_key(e, rank.swa_split) == key for e in t.all("kv_pool"))
        return d if t.has("pool_end") or (taken and d.has("load_begin")) else t
    if ev.kind == "pool_end" and t.has("pool_end") and d.has("kv_pool"):
        return d
    taken = t.has(ev.kind)
    return d if taken and d.has("load_begin") else t


def pool_key(ev: LogEvent, swa_split: Optional[LogEvent]) -> str:
    """Which pool a KV line is: its label ("Full", "SWA": 0.5.17+), else, after a sliding-window split,
    "SWA" when its #tokens is the split's SWA count and not its full one. 0.5.16 prints SWAKVPool's two
    halves unlabelled, the SWA pool first (swa_memory_pool.py SWAKVPool.__init__, sglang 0.5.16)."""
    label = str(ev.data.get("label") or "")
    if label or swa_split is None:
        return label
    tokens, split = ev.data.get("tokens"), swa_split.data
    if tokens is not None and tokens == split.get("swa_tokens") and tokens != split.get("full_tokens"):
        return "SWA"
    return "Full"


# Draft architectures name themselves (DeepseekV3ForCausalLMNextN, LlamaForCausalLMEagle3, …):
# a fragment that starts after the target's weights still gets its draft line right.
_DRAFT_MODEL = re.compile(r"NextN|Eagle|MTP|Draft", re.IGNORECASE)


def _is_draft_model(ev: LogEvent) -> bool:
    return ev.kind == "load_end" and bool(_DRAFT_MODEL.search(str(ev.data.get("model_type") or "")))


def _rank_sort_key(rank: str) -> Tuple[Tuple[str, int], ...]:
    parts = []
    for token in rank.split():
        name = token.rstrip("0123456789")
        parts.append((name, int(token[len(name):][:9] or 0)))
    return tuple(parts)
