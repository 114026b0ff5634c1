"""What every engine's log parser produces: one record per recognised line.

Engine-neutral on purpose: every engine's parser (``collectors/<engine>/``) emits ``LogEvent`` and
segments them into startups, so the reader (``collectors/logfile.py``) and the model handle any
engine's events the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar

from kvforensics.collectors.shipping import unwrap

__all__ = ["EngineStartup", "EventCap", "LogEvent", "MAX_STARTUP_BYTES", "MAX_STARTUP_EVENTS", "StartupBook", "notes",
           "segment"]


@dataclass(frozen=True)
class LogEvent:
    """One recognised startup-log record.

    ``rank`` is the record's rank or worker tag as printed (SGLang ``"TP3"``, ``"DP1 TP3"``; vLLM
    ``"Worker_TP0 pid=26347"``), ``""`` for a record with a header but no tag, and ``None`` when
    the line had no header of the engine at all (traceback text, custom logging).
    ``data`` holds the parsed values; sizes are int bytes and end in ``_bytes``.
    """

    kind: str
    line: Optional[int]  # 1-based line number in the source; None when not counted
    offset: int  # byte offset of the line in the source (decompressed stream for .gz)
    rank: Optional[str]
    ts: Optional[str]
    data: Dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the message, shortened, for evidence
    raw: str = ""  # the physical line, so a startup can be saved and parsed again elsewhere
    fmt: str = ""  # the name of the line-format row that recognised it (collectors/<engine>/formats.py)


@dataclass(frozen=True)
class EngineStartup:
    """The events of one launch, in file order; each engine's segmenter makes its own subclass."""

    events: Tuple[LogEvent, ...]
    closed: bool  # finished or failed, as the engine's segmenter decides
    engine: str  # its plug-in's name; each engine's subclass sets it
    dropped: int = 0  # events past the startup's cap (EventCap), counted but not kept

    @property
    def first_line(self) -> Optional[int]:
        return self.events[0].line if self.events else None

    @property
    def first_offset(self) -> int:
        return self.events[0].offset if self.events else 0


# What one startup may keep. A real one holds a few hundred events (the largest shipped log: 148, 15 KB);
# a forged or looping log of millions of startup lines with no boundary between them would otherwise
# keep every event, so memory and time grew with the file.
MAX_STARTUP_EVENTS = 20_000
MAX_STARTUP_BYTES = 16 << 20  # the lines and messages kept (a line may be megabytes long)


class EventCap:
    """Counts the current startup's events against MAX_STARTUP_EVENTS and MAX_STARTUP_BYTES. A segmenter
    keeps (and lets change its state) only the events ``admit`` accepts, so what it holds per startup
    is bounded whatever the input; it counts the rest per startup (``Startup.dropped``), for a note
    (``notes``). One per segmenter, reset at each startup: a million startups cost no million caps."""

    __slots__ = ("count", "bytes")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.bytes = 0

    def admit(self, ev: LogEvent) -> bool:
        size = len(ev.raw) + len(ev.text)
        if self.count >= MAX_STARTUP_EVENTS or self.bytes + size > MAX_STARTUP_BYTES:
            return False
        self.count += 1
        self.bytes += size
        return True


S = TypeVar("S")
_DROPPED: Tuple[LogEvent, ...] = ()  # a startup counted, not kept (shared, empty)


class StartupBook:
    """What every engine's segmenter keeps: the startups seen, whether each has ended, and the events past each
    one's cap. ``keep`` bounds memory for any input: with ``keep=k > 0`` only the first k startups keep their
    events, with ``keep=-k`` only the last k; the others are counted, not stored (a log of a million crash-loop
    restarts costs a counter, not gigabytes). An engine's segmenter decides where a startup begins and ends."""

    def __init__(self, keep: Optional[int] = None) -> None:
        self.startups: List[Any] = []  # each a list of events, or _DROPPED where not kept
        self._closed: List[bool] = []
        self._dropped: List[int] = []  # per startup: events past the cap
        self._cap = EventCap()
        self._keep = keep

    @property
    def current_closed(self) -> bool:
        return bool(self._closed) and self._closed[-1]

    def open_startup(self) -> None:
        """A new startup: kept or only counted, its cap fresh; one that can no longer be among the last k dropped."""
        index = len(self.startups)
        self.startups.append([] if self._keep is None or self._keep < 0 or index < self._keep else _DROPPED)
        self._closed.append(False)
        self._dropped.append(0)
        self._cap.reset()
        if self._keep is not None and self._keep < 0 and index >= -self._keep:
            self.startups[index + self._keep] = _DROPPED

    def admit(self, ev: LogEvent) -> bool:
        """Store ``ev`` in the current startup (where kept); False past its cap: then neither kept nor to be
        remembered, so what a segmenter holds per startup stays bounded too."""
        if not self._cap.admit(ev):
            self._dropped[-1] += 1
            return False
        self.append(ev)
        return True

    def append(self, ev: LogEvent) -> None:
        """Add ``ev`` to the current startup without the cap (a line that only ends it)."""
        if self.startups[-1] is not _DROPPED:
            self.startups[-1].append(ev)

    def results(self, startup: Callable[..., S]) -> List[S]:
        return [startup(tuple(evs), closed, dropped=dropped)
                for evs, closed, dropped in zip(self.startups, self._closed, self._dropped)]


def notes(startup: EngineStartup) -> Tuple[str, ...]:
    """What the reader must say about a startup it could not keep whole."""
    if not startup.dropped:
        return ()
    return ("{:,} line(s) of this startup past its first {:,} (or {} MiB) were not kept: a startup that long is "
            "not one engine launch (a looping or edited log); the analysis uses the lines kept".format(
                startup.dropped, MAX_STARTUP_EVENTS, MAX_STARTUP_BYTES >> 20),)




def segment(rows: Iterable[Tuple[Optional[int], int, str]], parse_line: Callable[[str, Optional[int], int],
            List[LogEvent]], segmenter: Any) -> List[S]:
    """Feed ``(line number, byte offset, raw line)`` rows through an engine's parser and segmenter.

    Rows saved elsewhere (a bundle, a journal, ``docker logs``) may still carry a shipper's prefix:
    it is removed as the file reader removes it, so the same line gives the same events."""
    for number, offset, raw in rows:
        for ev in parse_line(unwrap(raw), number, offset):
            segmenter.feed(ev)
    return segmenter.result()
