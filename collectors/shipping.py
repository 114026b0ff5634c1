"""Undo what a log's shipper added to each line, so an engine's parser sees the line the engine wrote.

Between an engine and the file a person hands us sit container runtimes, ``kubectl`` and people
pasting into issues, and each may wrap the engine's lines:

* a container runtime's CRI log file (containerd, CRI-O: ``/var/log/pods/…/0.log``):
  ``2026-05-01T10:00:00.123456789Z stdout F <line>``, a long line split into several ``P``
  (partial) records and one final ``F`` record, each with its own prefix;
* ``kubectl logs --timestamps`` and ``docker logs --timestamps``: ``2026-05-01T10:00:00.123456789Z <line>``;
  RFC 3339 with an offset (``+00:00``) from other runtimes;
* ANSI colour (SGR) escapes, anywhere in the line (vLLM colours its process prefix on a terminal), as
  bytes or typed in caret notation (``^[[0;36m``);
* ``> `` or ``>> `` before every line, a quote marker added when pasting.

``unwrap`` removes those from one line; ``CriJoiner`` joins a CRI file's partial records into the
lines the engine wrote. An engine's own prefix is never touched: it does not begin with an RFC 3339
timestamp with a ``T`` and a zone, nor with ``>`` (SGLang's is bracketed, ``[2026-05-01 10:00:00 TP0]``;
vLLM's is a level, ``INFO 05-01 …``, or a process, ``(EngineCore_DP0 pid=1)``).

Engine-neutral (it names no engine in code); standard library only, Python 3.8: shipped with the probe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional

__all__ = ["CriJoiner", "Joined", "MAX_LINE_BYTES", "looks_cri", "unwrap"]

# RFC 3339 with the "T" and a zone, as container runtimes, kubectl and docker write it; a zone is
# required so that a local "2026-05-01 10:00:00" some engine may print itself is never taken.
_RFC3339 = r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})"
_CRI_FIELDS = r" (?:stdout|stderr) [PF](?::[^ ]*)?"  # stream, then the tag ("P", "F"; more after ":")
# One layer a shipper put before the line; they stack (kubectl's timestamp before a pasted "> ").
_LAYER = re.compile(r"(?:" + _RFC3339 + r"(?:" + _CRI_FIELDS + r")?|>{1,2})(?: |$)")
# SGR only (colour and weight): cursor movement belongs to progress bars the parsers read as such. Also in
# caret notation, "^[" typed for ESC: what a terminal's copy, `cat -v` or `less` shows of those escapes and
# people paste into issues (a vLLM 0.14 log: "^[[0;36m(EngineCore_DP0 pid=…)^[[0;0m INFO …").
_SGR = re.compile(r"(?:\x1b|\^\[)\[[0-9;:]*m")

# A CRI record, as bytes (files are joined before decoding): the timestamp, the stream, the tag.
_CRI_RECORD = re.compile(
    (r"(?:" + _RFC3339 + r") (stdout|stderr) ([PF])(?::[^ \n]*)?(?: |$)").encode("ascii"))
CRI_SNIFF_LINES = 8  # the first lines of a file that must all be CRI records for it to be read as one
MAX_LINE_BYTES = 16 << 20  # a joined line is cut here: a runaway P run must not hold the whole file


def unwrap(line: str) -> str:
    """``line`` without ANSI colour and without the shippers' prefixes before it (any stack of them)."""
    while "\x1b" in line or "^[[" in line:  # again until none is left: removing one may close up another
        bare = _SGR.sub("", line)
        if bare == line:
            break
        line = bare
    while True:
        m = _LAYER.match(line)
        if m is None or m.end() == 0:
            return line
        line = line[m.end():]


def looks_cri(head: bytes) -> bool:
    """Whether a file beginning with ``head`` is a CRI log: its first lines (up to CRI_SNIFF_LINES,
    the last one only if whole) are all CRI records."""
    lines = head.split(b"\n")
    if len(lines) > 1:
        lines = lines[:-1]  # the last piece may be cut in the middle of a record
    lines = [x for x in lines[:CRI_SNIFF_LINES] if x.strip()]
    return bool(lines) and all(_CRI_RECORD.match(x) is not None for x in lines)


@dataclass(frozen=True)
class Joined:
    """One line as the engine wrote it, placed where its first record is in the file."""

    line: int  # the file's record number (1-based) of its first record
    offset: int  # byte offset of its first record
    text: bytes  # the content of its records, joined, without their prefixes


class _Run:
    """The records of one stream's line still awaiting their ``F`` record."""

    def __init__(self, line: int, offset: int) -> None:
        self.line = line
        self.offset = offset
        self.parts: List[bytes] = []
        self.size = 0
        self.cut = False

    def add(self, content: bytes, cap: int) -> None:
        room = cap - self.size
        if len(content) > room:
            content = content[:max(room, 0)]
            self.cut = True
        if content:
            self.parts.append(content)
            self.size += len(content)

    def joined(self) -> Joined:
        return Joined(self.line, self.offset, b"".join(self.parts))


class CriJoiner:
    """Joins a CRI file's ``P`` records with the records of the same stream up to its ``F`` record.

    Fed the file's records in order, it returns each line when its last record arrives; stdout and
    stderr are joined apart, as the runtime writes them interleaved. Memory stays flat: a line over
    ``cap`` bytes keeps its first ``cap`` bytes (``cut`` counts them). A record that is not CRI-shaped
    is a line of its own."""

    def __init__(self, cap: Optional[int] = None) -> None:
        self.cap = MAX_LINE_BYTES if cap is None else cap
        self._open: Dict[bytes, _Run] = {}
        self.joined = 0  # lines that were split into more than one record
        self.cut = 0  # lines longer than ``cap``

    @property
    def pending(self) -> bool:
        return bool(self._open)

    def feed(self, record: bytes, line: int, offset: int) -> Optional[Joined]:
        m = _CRI_RECORD.match(record)
        if m is None:
            return Joined(line, offset, record)
        stream, partial, content = m.group(1), m.group(2) == b"P", record[m.end():]
        run = self._open.get(stream)
        if run is None:
            if not partial:
                self.cut += len(content) > self.cap
                return Joined(line, offset, content[:self.cap])
            run = self._open[stream] = _Run(line, offset)
        run.add(content, self.cap)
        if partial:
            return None
        del self._open[stream]
        return self._close(run)

    def finish(self) -> List[Joined]:
        """The lines whose ``F`` record never came (the file ends inside them), in file order."""
        runs = sorted(self._open.values(), key=lambda r: r.offset)
        self._open = {}
        return [self._close(r) for r in runs]

    def _close(self, run: _Run) -> Joined:
        self.joined += 1
        self.cut += run.cut
        return run.joined()
