"""Line-format tables: how an engine's log lines are recognised, and what each shape says.

An engine describes its log as an ordered table of ``LineFormat`` rows. One row is one shape
of one kind of line: a literal ``needle`` every such line contains (the fast reader searches
files for the needles, so only candidate lines are decoded), a regex, an extractor that turns
the match into event data, and version clues (which releases print that shape). The parser,
the era detection and the reader's keywords all read the same rows, so a new line variant or
a new engine is a new row, not an edit to three if-chains.

Standard library only, Python 3.8: this module is shipped to inspected hosts with the probe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple, Union

Version = Tuple[int, int, int]
Data = Dict[str, Any]
# A clue looks at one event's data and text and answers (since, until, why) or None.
Clue = Callable[[Data, str], Optional[Tuple[Optional[Version], Optional[Version], str]]]


def version(text: Optional[str]) -> Optional[Version]:
    if text is None:
        return None
    a, b, c = (int(x) for x in text.split("."))
    return (a, b, c)


def always(since: Optional[str], until: Optional[str], why: str) -> Clue:
    """The shape itself dates the line."""
    found = (version(since), version(until), why)
    return lambda data, text: found


def when(test: Callable[[Data, str], bool], since: Optional[str], until: Optional[str], why: str) -> Clue:
    """The line dates the log only when ``test(data, text)`` holds."""
    found = (version(since), version(until), why)
    return lambda data, text: found if test(data, text) else None


def first(*alternatives: Clue) -> Clue:
    """The first alternative that applies (the others are then not asked)."""
    def pick(data: Data, text: str) -> Optional[Tuple[Optional[Version], Optional[Version], str]]:
        for alt in alternatives:
            found = alt(data, text)
            if found is not None:
                return found
        return None
    return pick


class Lazy:
    """A regex compiled on its first use. A log shows a handful of an engine's line shapes, and
    compiling every row of every engine's table at start-up cost ~10 ms of a 0.1 s ``analyze``
    (measured 2026-12-01); a row whose needle never occurs is never compiled."""

    __slots__ = ("source", "_compiled")

    def __init__(self, source: str) -> None:
        self.source = source
        self._compiled: "Optional[re.Pattern[str]]" = None

    def compiled(self) -> "re.Pattern[str]":
        if self._compiled is None:
            self._compiled = re.compile(self.source)
        return self._compiled

    def match(self, text: str) -> "Optional[re.Match[str]]":
        return self.compiled().match(text)

    def search(self, text: str) -> "Optional[re.Match[str]]":
        return self.compiled().search(text)


@dataclass(frozen=True)
class LineFormat:
    """One recognised shape of one kind of log line."""

    name: str  # unique within the engine's table; events carry it
    kind: str  # the event kind it yields ("load_end", "failure", …)
    needle: str  # a literal every matching message contains
    pattern: "Union[re.Pattern[str], Lazy]"
    extract: Callable[["re.Match[str]", str], Optional[Data]]  # None: not this row after all
    clues: Tuple[Clue, ...] = ()
    anywhere: bool = False  # search the message instead of matching at its start


def match(rows: Sequence[LineFormat], msg: str) -> Optional[Tuple[LineFormat, Data]]:
    """The first row that recognises ``msg`` (a message without its prefix), with its data."""
    for row in rows:
        if row.needle not in msg:
            continue
        m = row.pattern.search(msg) if row.anywhere else row.pattern.match(msg)
        if m is None:
            continue
        try:
            data = row.extract(m, msg)
        except (ValueError, OverflowError):  # an implausible figure (formats bound them): not this row
            continue
        if data is not None:
            return row, data
    return None


def keywords(rows: Iterable[LineFormat], extra: Iterable[str] = ()) -> Tuple[bytes, ...]:
    """The fewest needles that still find every row's lines: a needle that contains a shorter
    one is implied by it (every line holding "avail mem=3.1 GB" holds "GB")."""
    needles = sorted({row.needle for row in rows} | set(extra), key=len)
    kept = []
    for n in needles:
        if not any(k in n for k in kept):
            kept.append(n)
    return tuple(k.encode("utf-8") for k in kept)
