"""Split a stream of SGLang log events into startups (one per server launch).

A log file often holds several launches (restarts with new flags, crash loops). A new startup
begins at:

* a ``server_args=`` line (printed once per launch by the main process, all versions), or
* a rank's ``Init … begin`` / ``Load weight begin`` line that cannot belong to the current
  launch: the rank's group already printed the scheduler summary or a startup failure, the
  rank already loaded a target and a draft, its previous load never ended, or the launch's
  server_args say there is no speculative draft to load.

The second ``Load weight begin`` of a rank is its draft runner (speculative decoding): SGLang
prints no "draft" marker on those lines (research §1.2), so order within the rank decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set, Tuple

from kvforensics.collectors.events import EngineStartup, LogEvent, StartupBook, segment
from kvforensics.collectors.sglang.log import parse_line

_BEGIN_KINDS = ("dist_init_begin", "load_begin")


@dataclass(frozen=True)
class Startup(EngineStartup):
    """The events of one SGLang launch; closed once a scheduler summary or a startup failure was seen."""

    engine: str = "sglang"


def _group(rank: Optional[str]) -> str:
    """The DP replica a rank belongs to ("DP1" of "DP1 TP3"), "" without a DP tag."""
    if rank:
        head = rank.split(" ", 1)[0]
        if head.startswith("DP"):
            return head
    return ""


class StartupSegmenter(StartupBook):
    """Feed events in file order; ``startups`` holds the launches seen so far (``keep``: collectors/events.py
    StartupBook)."""

    def __init__(self, keep: Optional[int] = None) -> None:
        super().__init__(keep)
        self._fed = 0  # events of the current startup, kept or not
        self._reset()

    def _reset(self) -> None:
        self._loads: Dict[Optional[str], int] = {}
        self._open_load: Set[Optional[str]] = set()
        self._closed_groups: Set[str] = set()
        self._failed = False
        self._speculative: Optional[bool] = None  # from server_args; None = unknown

    def feed(self, ev: LogEvent) -> None:
        if not self.startups or self._is_boundary(ev):
            self.open_startup()
            self._fed = 0
            self._reset()
        self._fed += 1
        if self.admit(ev):  # past the cap: neither kept nor remembered (the per-rank state stays bounded too)
            self._update(ev)

    def _is_boundary(self, ev: LogEvent) -> bool:
        if ev.kind == "server_args":
            return self._fed > 0
        if ev.kind not in _BEGIN_KINDS or ev.rank is None:
            return False
        rank = ev.rank
        if self._failed or _group(rank) in self._closed_groups:
            return True
        if ev.kind == "load_begin":
            loads = self._loads.get(rank, 0)
            if rank in self._open_load or loads >= 2:
                return True
            if loads == 1 and self._speculative is False:
                return True
        return False

    def _update(self, ev: LogEvent) -> None:
        kind = ev.kind
        if kind == "server_args":
            algo = ev.data["args"].get("speculative_algorithm")
            self._speculative = algo not in (None, "None", "", "NONE")
        elif kind == "load_begin":
            self._loads[ev.rank] = self._loads.get(ev.rank, 0) + 1
            self._open_load.add(ev.rank)
        elif kind == "load_end":
            self._open_load.discard(ev.rank)
        elif kind == "summary":
            self._closed_groups.add(_group(ev.rank))
            self._closed[-1] = True
        elif kind == "failure" and not self._closed[-1]:
            self._failed = True
            self._closed[-1] = True

    def result(self) -> List[Startup]:
        return self.results(Startup)


def segment_lines(lines: Iterable[Tuple[Optional[int], int, str]]) -> List[Startup]:
    """Startups from ``(line number, byte offset, raw line)`` rows: a snapshot's saved lines, a journal."""
    return segment(lines, parse_line, StartupSegmenter())


def begins_cleanly(startup: Startup, window_start: int, back: int) -> bool:
    """Whether the first startup in a reading window cannot have begun before the window.

    True when it opens with ``server_args=`` (the first line of every launch), or when every
    rank's first line is an ``Init … begin``/``Load weight begin`` and the startup begins in the
    later half of the window (a cut through a startup's first lines would leave a rank whose
    first line is something else).
    """
    if startup.events[0].kind == "server_args":
        return True
    if startup.first_offset - window_start < back // 2:
        return False
    seen = set()
    for ev in startup.events:
        if ev.rank is None or ev.rank in seen:
            continue
        seen.add(ev.rank)
        if ev.kind not in _BEGIN_KINDS:
            return False
    return bool(seen)


def owns_event(ev: LogEvent) -> bool:
    """A traceback line still names SGLang when it carries its "[time TP0]" tag."""
    return bool(ev.rank)
