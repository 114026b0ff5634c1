"""What every engine's log parser produces: one record per recognised line.

Engine-neutral on purpose: every engine's parser (``collectors/<engine>/``) emits ``LogEvent`` and
segments them into startups, so the reader (``collectors/logfile.py``) and the model handle any
engine's events the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar

from collectors.shipping import unwrap

__all__ = ["EngineStartup", "LogEvent", "segment"]


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

    @property
    def first_line(self) -> Optional[int]:
        return self.events[0].line if self.events else None

    @property
    def first_offset(self) -> int:
        return self.events[0].offset if self.events else 0


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
