"""What every engine's log parser produces: one record per recognised line.

Engine-neutral on purpose: every engine's parser (``collectors/<engine>/``) emits ``LogEvent`` and
segments them into startups, so the reader (``collectors/logfile.py``) and the model handle any
engine's events the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar

from collectors.shipping import unwrap

__all__ = ["EngineStartup", "EventCap", "LogEvent", "MAX_STARTUP_BYTES", "MAX_STARTUP_EVENTS", "notes", "segment"]


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


def notes(startup: EngineStartup) -> Tuple[str, ...]:
    """What the reader must say about a startup it could not keep whole."""
    if not startup.dropped:
        return ()
    return ("{:,} line(s) of this startup past its first {:,} (or {} MiB) were not kept: a startup that long is "
            "not one engine launch (a looping or edited log); the analysis uses the lines kept".format(
                startup.dropped, MAX_STARTUP_EVENTS, MAX_STARTUP_BYTES >> 20),)


S = TypeVar("S")


def segment(rows: Iterable[Tuple[Optional[int], int, str]], parse_line: Callable[[str, Optional[int], int],
            List[LogEvent]], segmenter: Any) -> List[S]:
    """Feed ``(line number, byte offset, raw line)`` rows through an engine's parser and segmenter.

    Rows saved elsewhere (a bundle, a journal, ``docker logs``) may still carry a shipper's prefix:
    it is removed as the file reader removes it, so the same line gives the same events."""
    for number, offset, raw in rows:
        for ev in parse_line(unwrap(raw), number, offset):
            segmenter.feed(ev)
    return segmenter.result()
