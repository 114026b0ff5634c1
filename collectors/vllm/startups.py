"""Split a stream of vLLM log events into startups (one per engine launch).

A new startup begins at a launch line (``Initializing … LLM engine (vX) with config``, the
``non-default args`` line, a ``vllm serve`` command line) when the current one has other events
or already printed that launch line (one launch prints several of them in a row), at a
worker's second weights line, at a worker's second profiling/KV line with other figures, at a
memory line after the current startup failed (unless its timestamp says it was printed before
the failure: pasted logs are not always in order), and at a V1 max-model-len failure after the KV
cache was already sized (the check runs before the sizes are printed). Identical repeats of a
line from the same worker (Ray Serve relays a line twice; a paste repeated) are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Set, Tuple

from kvforensics.collectors.events import EngineStartup, LogEvent, StartupBook, segment
from kvforensics.collectors.vllm.log import parse_line

_LAUNCH_KINDS = ("engine_config", "args")
_ONCE_PER_WORKER = ("weights", "budget", "breakdown", "global_profile", "available_kv", "profile_begin")
_MEMORY_KINDS = _ONCE_PER_WORKER + ("blocks", "kv_tokens", "concurrency", "suggestion", "graph_estimate")
_SIZED = ("blocks", "kv_tokens", "concurrency")


@dataclass(frozen=True)
class Startup(EngineStartup):
    """The events of one vLLM launch; closed once the engine finished (init done, graphs captured
    after the KV cache, or a serving line) or failed."""

    engine: str = "vllm"


class StartupSegmenter(StartupBook):
    """Feed events in file order (``keep``: collectors/events.py StartupBook)."""

    def __init__(self, keep: Optional[int] = None) -> None:
        super().__init__(keep)
        self._reset()

    def _reset(self) -> None:
        self._fed = 0
        self._seen: Set[Tuple[Optional[str], str]] = set()
        self._texts: Set[Tuple[str, str, str]] = set()
        self._failed_ts: Optional[str] = None
        self._failed = False
        self._sized = False
        self._launch_fmts: Set[str] = set()  # launch lines fed so far ...
        self._launch_only = True  # ... and nothing else yet
        self._banners: Set[str] = set()  # the engine cores that printed their banner

    @property
    def awaiting_end(self) -> bool:
        """A startup is open: a serving line would end it."""
        return bool(self.startups) and not self._closed[-1] and self._fed > 0

    def feed(self, ev: LogEvent) -> None:
        if ev.kind == "serving":  # ends the open startup; alone (days of stat lines) it starts none
            if self.startups and not self._closed[-1] and self._fed:
                self.append(ev)
                self._closed[-1] = True
            return
        key = (ev.rank or "", ev.fmt, ev.text)
        if self._repeat(ev, key):
            return
        if not self.startups or self._is_boundary(ev):
            self.open_startup()
            self._reset()
        self._fed += 1
        if not self.admit(ev):
            return  # past the cap: neither kept nor remembered (the sets below stay bounded too)
        self._texts.add(key)
        self._update(ev)

    def _repeat(self, ev: LogEvent, key: Tuple[str, str, str]) -> bool:
        """The same memory line again from the same worker while the startup is open (Ray Serve relays a
        line twice; a paste repeated); once the startup ended, the same line is the next launch's."""
        return bool(self.startups) and key in self._texts and ev.kind in _MEMORY_KINDS and ev.kind != "weights" \
            and not self._closed[-1]

    def _is_boundary(self, ev: LogEvent) -> bool:
        if self._fed == 0:
            return False
        if ev.kind == "engine_config":
            # One launch prints one banner per engine core (data parallel: EngineCore_DP0, _DP1, …), not
            # always before the first memory line: a banner is a new launch when its engine already
            # printed one, or when this startup has events and no banner yet.
            name = _process_name(ev)
            return name in self._banners or (not self._launch_only and not self._banners)
        if ev.kind in _LAUNCH_KINDS:
            # One launch prints several such lines (the API server's `non-default args`, then the
            # engine's `Initializing a V1 LLM engine`): a new startup needs a repeat or later events.
            return not self._launch_only or ev.fmt in self._launch_fmts
        if self._failed and ev.kind in _MEMORY_KINDS:
            return not (ev.ts and self._failed_ts and ev.ts < self._failed_ts)
        if ev.kind == "failure" and ev.fmt == "maxlen_v1" and self._sized:
            return True
        return ev.kind in _ONCE_PER_WORKER and (ev.rank or "", ev.kind) in self._seen

    def _update(self, ev: LogEvent) -> None:
        if ev.kind == "engine_config":
            self._banners.add(_process_name(ev))
        if ev.kind in _LAUNCH_KINDS:
            self._launch_fmts.add(ev.fmt)
        elif ev.kind != "args_tail":  # a hard-wrapped args line's rest is still the launch's
            self._launch_only = False
        if ev.kind in _ONCE_PER_WORKER:
            self._seen.add((ev.rank or "", ev.kind))
        if ev.kind in _SIZED:
            self._sized = True
        if ev.kind == "failure":
            self._failed = True
            if ev.ts and (self._failed_ts is None or ev.ts > self._failed_ts):
                self._failed_ts = ev.ts
            self._closed[-1] = True
        elif ev.kind == "init_done" or (ev.kind == "graph_end" and self._sized):
            self._closed[-1] = True

    def result(self) -> List[Startup]:
        return self.results(Startup)


def _process_name(ev: LogEvent) -> str:
    """The printing process without its PID (``EngineCore_DP1``): a restart prints the same name."""
    return (ev.rank or "").split(" pid=")[0].split(",")[0].strip()


def segment_lines(lines: Iterable[Tuple[Optional[int], int, str]]) -> List[Startup]:
    return segment(lines, parse_line, StartupSegmenter())


def begins_cleanly(startup: Startup, window_start: int, back: int) -> bool:
    """Whether the first startup in a reading window cannot have begun before it: it opens with a
    launch line, or begins in the window's later half (vLLM has no per-rank opening line to check)."""
    if startup.events[0].kind in _LAUNCH_KINDS:
        return True
    return startup.first_offset - window_start >= back // 2


# The process prefixes vLLM prints before a record (another framework's Ray actor, e.g. verl's
# WorkerDict, is not vLLM's).
# "VllmWorker " is 0.10.x's multiproc worker ("VllmWorker TP1 pid=3975", see log.py).
_OWN_PROCESSES = ("EngineCore", "Worker_", "Worker pid", "VllmWorkerProcess", "VllmWorker ", "RayWorkerWrapper",
                  "RayWorkerProc")


def owns_event(ev: LogEvent) -> bool:
    """A traceback line still names vLLM when it has vLLM's header or one of its process prefixes."""
    return "header" in ev.data or (ev.rank or "").startswith(_OWN_PROCESSES)
