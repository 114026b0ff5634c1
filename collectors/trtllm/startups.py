"""Split a stream of TensorRT-LLM log events into startups (one per launch).

A new startup begins at a version banner once the current startup has more than banners (every process
of one launch prints its own banner first: the trtllm-serve launcher, then each MPI worker), at any
startup line once the current startup has ended (ready, or failed: the lines that explain a failure —
the component table, the exception and its frames — still belong to it), and at a rank's second
weights snapshot (``Memory used after loading model weights (inside torch)`` from the same ``[RANK n]``).

The C++ runtime's lines carry no rank, and at TP > 1 each rank prints the same line: identical lines
are kept, not dropped as a paste's repeats, because their number is the number of ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Set, Tuple

from kvforensics.collectors.events import EngineStartup, LogEvent, StartupBook, segment
from kvforensics.collectors.trtllm.log import parse_line

_PREAMBLE = ("banner", "backend", "mpi")
# What still explains a failure after its first line (or, after ready, what went wrong while serving).
_AFTER_FAILURE = ("failure", "failure_detail", "exception")


@dataclass(frozen=True)
class Startup(EngineStartup):
    """The events of one TensorRT-LLM launch; closed once the server was ready or the startup failed."""

    engine: str = "trtllm"


class StartupSegmenter(StartupBook):
    """Feed events in file order (``keep``: collectors/events.py StartupBook)."""

    def __init__(self, keep: Optional[int] = None) -> None:
        super().__init__(keep)
        self._reset()

    def _reset(self) -> None:
        self._fed = 0
        self._preamble_only = True
        self._weighed: Set[str] = set()  # ranks that printed their weights snapshot

    @property
    def awaiting_end(self) -> bool:
        return bool(self.startups) and not self._closed[-1] and self._fed > 0

    def feed(self, ev: LogEvent) -> None:
        if not self.startups or self._is_boundary(ev):
            self.open_startup()
            self._reset()
        self._fed += 1
        if self.admit(ev):
            self._update(ev)

    def _is_boundary(self, ev: LogEvent) -> bool:
        if self._fed == 0:
            return False
        if ev.kind == "banner":
            return not self._preamble_only
        if self._closed[-1]:  # a failure's explanation, or an out-of-memory error while serving, stays
            return ev.kind not in _AFTER_FAILURE + ("ready",)
        return ev.kind == "after_weights" and "weights_bytes" in ev.data and (ev.rank or "") in self._weighed

    def _update(self, ev: LogEvent) -> None:
        if ev.kind not in _PREAMBLE:
            self._preamble_only = False
        if ev.kind == "after_weights" and "weights_bytes" in ev.data:
            self._weighed.add(ev.rank or "")
        if ev.kind == "failure":
            self._closed[-1] = True
        elif ev.kind == "ready":
            self._closed[-1] = True

    def result(self) -> List[Startup]:
        return self.results(Startup)


def segment_lines(lines: Iterable[Tuple[Optional[int], int, str]]) -> List[Startup]:
    return segment(lines, parse_line, StartupSegmenter())


def begins_cleanly(startup: Startup, window_start: int, back: int) -> bool:
    """Whether the first startup in a reading window cannot have begun before it: it opens with a banner, or
    begins in the window's later half."""
    if startup.events[0].kind == "banner":
        return True
    return startup.first_offset - window_start >= back // 2


def owns_event(ev: LogEvent) -> bool:
    """A generic line (an exception) still names TensorRT-LLM when one of its loggers printed it."""
    return ev.data.get("logger") in ("cpp", "py", "autodeploy", "banner", "trt")
