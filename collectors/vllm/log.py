"""Recognise vLLM startup log lines and turn them into events (pure: text in, events out).

A vLLM record is ``LEVEL MM-DD HH:MM:SS [file.py:123] message`` (``file.py:123]`` without ``[``
before 0.8), often behind process prefixes: ``(VllmWorkerProcess pid=13105) ``,
``(EngineCore_DP0 pid=563) ``, ``(VllmWorker TP0 pid=3974) `` (0.10.x), ``(Worker_TP0 pid=26347) ``,
Ray's ``(RayWorkerWrapper pid=N, ip=A) ``
(nested under Ray Serve), and Ray's ``[repeated 30x across cluster]`` suffix. The innermost
prefix is the worker tag (``"Worker_TP0 pid=26347"``); ``""`` for a record without one;
``None`` for a line with no vLLM header at all (traceback text, a pasted fragment).
Foreign prefixes before all that (a Kubernetes viewer, a CI timestamp, markdown quotes and
bullets, ``[rank0]:``) are dropped.
"""

from __future__ import annotations

import re
from typing import Iterable, List, Optional, Tuple

from kvforensics.collectors import lineformat
from kvforensics.collectors.events import LogEvent
from kvforensics.collectors.lineformat import LineFormat
from kvforensics.collectors.vllm.formats import FORMATS

__all__ = ["LogEvent", "classify", "parse_line", "parse_lines", "split_record"]

_ANSI = re.compile(r"(?:\x1b|\^\[)\[[0-9;?]*[ -/]*[@-~]")  # ESC, or "^[" typed (caret notation)
# "2025-02-22 12:25:53 | pod/container | ", "[2026-02-24T20:21:58Z] ", "> ", "- ", "[rank0]: ".
_FOREIGN = re.compile(
    r"^(?:\d{4}-\d{2}-\d{2}[ T][\d:.,]+ \| [^|]* \| |\[\d{4}-\d{2}-\d{2}T[\d:.,]+Z?\] |> |- |\[rank\d+\]: ?)+")
# One process prefix: "(Name pid=N)" or "(Name pid=N, ip=A)"; Ray Serve nests several. The name may
# carry a blank and a rank: vLLM 0.10.x's multiproc workers print "(VllmWorker TP0 pid=N)" (v0.10.1.1
# v1/executor/multiproc_executor.py WorkerProc.__init__: process_name = f"{process_name} {suffix}",
# suffix "TP0", "PP1", "PP1_TP0"; later releases print "Worker_TP0").
_PROC = re.compile(r"^\(?(?P<tag>[\w:.@/-]+(?: (?:PP\d+_?)?(?:TP\d+)?)? pid=\d+(?:, ip=[\d.:a-fA-F]+)?)\)\s*")
_HEADER = re.compile(
    r"^(?:(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) +)?(?:(?P<ts>\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?) +)?"
    r"\[?(?P<file>[\w.-]+\.py)(?::(?P<lineno>\d+))?\] +")
# Matched where its literal last starts (rfind), not searched: "\s*" searched from every blank of a
# long run of blanks reads to the run's end each time (quadratic).
_REPEATED = re.compile(r"\[repeated (\d+)x across cluster\]$")


def split_record(raw: str) -> Tuple[Optional[str], Optional[str], Optional[str], str, Optional[int]]:
    """``(ts, worker tag, file:line header, message, repeated)`` of one physical line."""
    text = _ANSI.sub("", raw).replace("\r", "").rstrip()
    text = _FOREIGN.sub("", text.lstrip(), count=1)
    tag: Optional[str] = None
    while True:
        m = _PROC.match(text)
        if m is None:
            break
        tag = m.group("tag")  # the innermost prefix wins
        text = text[m.end():]
    repeated = None
    at = text.rfind("[repeated ")
    r = _REPEATED.match(text, at) if at >= 0 else None
    if r is not None:
        repeated = int(r.group(1)) if len(r.group(1)) <= 9 else None  # int() of 4,300+ digits raises
        text = text[:at].rstrip()
    h = _HEADER.match(text)
    if h is None or (h.group("level") is None and not text.startswith("[")):
        return None, tag, None, text.strip(), repeated
    header = h.group("file") + (":" + h.group("lineno") if h.group("lineno") else "")
    return h.group("ts"), tag if tag is not None else "", header, text[h.end():].strip(), repeated


def classify(msg: str) -> Optional[Tuple[LineFormat, dict]]:
    if not msg:
        return None
    return lineformat.match(FORMATS, msg)


def parse_line(raw: str, line: Optional[int] = None, offset: int = 0) -> List[LogEvent]:
    ts, tag, header, msg, repeated = split_record(raw)
    found = classify(msg)
    if found is None:
        return []
    row, data = found
    data = dict(data)
    if header:
        data["header"] = header
    if repeated:
        data["repeated"] = repeated
    text = msg if len(msg) <= 240 else msg[:237] + "..."
    return [LogEvent(kind=row.kind, line=line, offset=offset, rank=tag, ts=ts, data=data, text=text, raw=raw,
                     fmt=row.name)]


def parse_lines(lines: Iterable[str]) -> List[LogEvent]:
    events: List[LogEvent] = []
    for number, raw in enumerate(lines, 1):
        events.extend(parse_line(raw, number, 0))
    return events
