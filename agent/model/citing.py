"""How a finding cites the log line it rests on, and lists things in a sentence, for every engine."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

from kvforensics.collectors.events import LogEvent


def and_list(items: Iterable[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    words = list(items)
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def where(ev: Optional[LogEvent]) -> str:
    """Evidence for one event: 'line 123' (or 'byte 4567' when lines were not counted)."""
    if ev is None:
        return ""
    return "line {}".format(ev.line) if ev.line is not None else "byte {}".format(ev.offset)


class CitesEvent:
    """For records that rest on one log event (``self.event``): its values and where it is."""

    event: LogEvent

    @property
    def data(self) -> Dict[str, Any]:
        return self.event.data

    @property
    def line(self) -> Optional[int]:
        return self.event.line

    @property
    def offset(self) -> int:
        return self.event.offset

    @property
    def where(self) -> str:
        return where(self.event)
