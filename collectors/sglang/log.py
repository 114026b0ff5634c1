"""Recognise SGLang (0.2.15–0.5.23) startup log lines and turn them into events.

Pure functions only: text in, frozen ``LogEvent`` records out. Reading files lives in
``collectors/logfile.py``; what the events mean lives in ``agent/``.

Units: every GPU-memory figure SGLang prints as "GB" is GiB (2**30 bytes):
``get_available_gpu_memory`` returns ``free / (1 << 30)`` and ``mem_cache/memory_pool.py``
divides by ``GB = 1024 * 1024 * 1024``. The one exception is HiCache host memory
(``Allocating … GB host memory``, ``--hicache-size``), which is decimal (1e9).
The line formats themselves, with the releases that print each shape, are the rows of
``collectors/sglang/formats.py``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from kvforensics.collectors import lineformat
from kvforensics.collectors.events import LogEvent
from kvforensics.collectors.lineformat import LineFormat
from kvforensics.collectors.sglang.formats import FORMATS, PRINT_TOLERANCE_BYTES
from kvforensics.collectors.units import GB, GIB

__all__ = ["GB", "GIB", "PRINT_TOLERANCE_BYTES", "LogEvent", "classify", "parse_line", "parse_lines",
           "parse_message", "record_starts", "split_records"]


# --- line prefixes -------------------------------------------------------------------------

# "[2026-01-01 10:00:00.123 DP1 TP3] msg" (0.3.6+), "[12:34:56 TP0] msg" (0.2.15–0.3.x).
# Searched, not matched: it may follow docker-compose "svc  | ", a journald header, a
# "--timestamps" prefix, or a tqdm bar the record was glued to.
_PREFIX = re.compile(
    r"\[(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,6})?|\d{2}:\d{2}:\d{2})"
    r"(?P<tags>(?: (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d{1,6})*)\] ?"
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# 0.2.0 "[gpu_id=0] ", 0.2.9 "[gpu=0] " inside the message (tolerated, not a rank tag).
_LEGACY_GPU = re.compile(r"^\[(gpu(?:_id)?=\d{1,6})\] ")
# A record that carries a GPU-memory figure (checked only for records no row recognised).
_MEMORY_FIGURE = re.compile(r"avail mem|mem usage|#tokens|\d GB\b", re.IGNORECASE)
# journald: "Jan 05 10:00:00 host unit[123]: "; docker compose: "name  | ".
_EXTERNAL = re.compile(
    r"^(?:[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \S+ [^\s:]+?(?:\[\d+\])?: |[\w.-]+\s+\| )"
)


def split_records(raw: str) -> List[Tuple[Optional[str], Optional[str], str]]:
    """Split one physical line into ``(ts, rank, message)`` records.

    Handles ANSI colour, CR/CRLF, tqdm redraws (``\\r``) and records glued after a progress
    bar. A part with no SGLang prefix yields ``(None, None, message)``.
    """
    return list(_records(raw))


def _records(raw: str) -> Iterator[Tuple[Optional[str], Optional[str], str]]:
    """split_records, one record at a time: a line of thousands of glued records holds no list of
    their matches (the reader cuts such lines at record_starts; a bundle's or a journal's lines it
    does not read may still be long)."""
    text = _ANSI.sub("", raw)
    for part in text.replace("\r", "\n").split("\n"):
        if not part.strip():
            continue
        prev = None
        for m in _PREFIX.finditer(part):
            if prev is not None:
                yield prev.group("ts"), prev.group("tags").strip(), part[prev.end():m.start()].strip()
            prev = m
        if prev is not None:
            yield prev.group("ts"), prev.group("tags").strip(), part[prev.end():].strip()
            continue
        msg = _EXTERNAL.sub("", part, count=1).strip()
        legacy = _LEGACY_GPU.match(msg)  # 0.2.x "[gpu_id=0] msg": no timestamp, the GPU as the tag
        yield None, legacy.group(1) if legacy else None, msg


# The same prefix in raw bytes: where the reader may cut a very long line of glued records so that
# each piece is whole records (collectors/logfile.py), with its own byte offset.
_PREFIX_BYTES = re.compile(_PREFIX.pattern.encode("ascii"))


def record_starts(buf: bytes, start: int, end: int) -> Iterator[int]:
    """Offsets in ``buf[start:end]`` where an SGLang record's prefix begins."""
    for m in _PREFIX_BYTES.finditer(buf, start, end):
        yield m.start()


def parse_message(msg: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    """Classify one message (prefix already removed). Returns ``(kind, data)`` or None."""
    found = classify(msg)
    return None if found is None else (found[0].kind, found[1])


def classify(msg: str) -> Optional[Tuple[LineFormat, Dict[str, Any]]]:
    """The line-format row that recognises ``msg``, and the data it extracted."""
    msg = _LEGACY_GPU.sub("", msg, count=1)
    if not msg:
        return None
    return lineformat.match(FORMATS, msg)


def parse_line(raw: str, line: Optional[int] = None, offset: int = 0) -> List[LogEvent]:
    """All events in one physical line (usually zero or one)."""
    events: List[LogEvent] = []
    for ts, rank, msg in _records(raw):
        found = classify(msg)
        text = msg if len(msg) <= 240 else msg[:237] + "..."
        if found is not None:
            row, data = found
            events.append(LogEvent(kind=row.kind, line=line, offset=offset, rank=rank, ts=ts, data=data, text=text,
                                   raw=raw, fmt=row.name))
        elif rank is not None and _MEMORY_FIGURE.search(msg):
            # An SGLang record with a memory figure in a shape no row knows: say so, never drop it silently.
            events.append(LogEvent(kind="unrecognized", line=line, offset=offset, rank=rank, ts=ts, data={}, text=text,
                                   raw=raw, fmt=""))
    return events


def parse_lines(lines: Iterable[str]) -> List[LogEvent]:
    """Parse an iterable of text lines, numbering them from 1 (offsets are not tracked)."""
    events: List[LogEvent] = []
    for number, raw in enumerate(lines, 1):
        events.extend(parse_line(raw, number, 0))
    return events
