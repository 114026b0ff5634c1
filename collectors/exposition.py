"""Prometheus text exposition, read strictly: a sample's name, its labels (quoted values with their
escapes, commas and braces inside them) and a finite value. What the engines' /metrics pages are
read with (collectors/engine_http.py); a NaN or a forged line never reaches a snapshot.
"""

from __future__ import annotations

import math
import re
from typing import Dict, Iterator, List, Optional, Tuple

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"")
FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_ESCAPES = {"\\": "\\", "\"": "\"", "n": "\n"}

Sample = Tuple[str, Dict[str, str], float]


def _label_value(line: str, pos: int) -> Optional[Tuple[str, int]]:
    """The unescaped value of a quoted label value opening at ``pos`` (just past its quote), and the
    position past its closing quote. Only \\\\, \\" and \\n are escapes in the text format; any other
    backslash stands for itself."""
    chars: List[str] = []
    while pos < len(line):
        c = line[pos]
        if c == "\"":
            return "".join(chars), pos + 1
        if c == "\\" and pos + 1 < len(line) and line[pos + 1] in _ESCAPES:
            chars.append(_ESCAPES[line[pos + 1]])
            pos += 2
            continue
        chars.append(c)
        pos += 1
    return None  # no closing quote: a truncated or garbled line


def parse_labels(line: str, pos: int) -> Optional[Tuple[Dict[str, str], int]]:
    """The labels of ``{a="x",b="y"}`` opening at ``pos`` (on the brace) and the position past the
    closing brace; None if malformed. Braces and commas inside quoted values are data."""
    labels: Dict[str, str] = {}
    pos += 1
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        m = _LABEL_NAME.match(line, pos)
        if m is None:
            return None
        value = _label_value(line, m.end())
        if value is None:
            return None
        labels.setdefault(m.group(1), value[0])
        pos = value[1]
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == ",":
            pos += 1  # a trailing comma before "}" is allowed
        elif pos >= len(line) or line[pos] != "}":
            return None


def finite(text: str) -> Optional[float]:
    """A sample value as a finite float; None for NaN, ±Inf and anything that is not a number."""
    if not FLOAT.match(text):
        return None  # also refuses what float() alone would take: "nan", "1_000", " 1"
    value = float(text)
    return value if math.isfinite(value) else None


def parse_sample(line: str) -> Optional[Sample]:
    """(name, labels, value) of one exposition line; None for comments, blanks, garbage and
    non-finite values (a NaN must not reach the snapshot: it is not JSON)."""
    m = _NAME.match(line)
    if m is None:
        return None
    labels: Dict[str, str] = {}
    pos = m.end()
    if pos < len(line) and line[pos] == "{":
        parsed = parse_labels(line, pos)
        if parsed is None:
            return None
        labels, pos = parsed
    if pos == m.end() and not line[pos:pos + 1].isspace():
        return None  # the name runs into something that is neither a label set nor a blank
    rest = line[pos:].split()
    if len(rest) not in (1, 2):
        return None  # a value and at most a timestamp
    value = finite(rest[0])
    return None if value is None else (m.group(0), labels, value)


def iter_samples(text: str, names: Tuple[str, ...]) -> Iterator[Sample]:
    """The samples of the named metrics, each (name, label set) once: the format forbids repeats,
    and counting one twice would inflate a sum."""
    seen = set()
    for line in text.splitlines():
        line = line.lstrip(" \t")
        if not line.startswith(names):
            continue  # cheap filter first: vLLM serves hundreds of histogram lines we never read
        sample = parse_sample(line)
        if sample is None or sample[0] not in names:
            continue
        key = (sample[0], tuple(sorted(sample[1].items())))
        if key not in seen:
            seen.add(key)
            yield sample
