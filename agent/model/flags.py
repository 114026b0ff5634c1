"""An engine's flags typed before the model reads them: a value of the wrong type or out of range is
unknown (dropped, with a problem that says why), never a crash and never a number the model trusts.

Flags come from a log's arguments line (parsed from a repr, so any Python literal), from a bundle's
``server_args`` (any JSON: the snapshot schema only says "an object") or from a live command line.
Each engine declares the keys its analysis and reports read (``FlagSpec`` per key); every other key
is kept as it is, for display only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Tuple

from kvforensics.agent.model.records import Problem

MAX_COUNT = 10**13  # tokens, lengths, requests: the log formats' own bound
MAX_TEXT = 4096  # a model path, a dtype, a backend name


@dataclass(frozen=True)
class FlagSpec:
    """What one flag must be: ``kind`` is "int", "number", "text" or "bool"; ``low``/``high`` bound
    numbers (inclusive)."""

    kind: str
    low: float = 0
    high: float = MAX_COUNT


def count(low: int = 0, high: int = MAX_COUNT) -> FlagSpec:
    return FlagSpec("int", low, high)


def number(low: float = -MAX_COUNT, high: float = MAX_COUNT) -> FlagSpec:
    return FlagSpec("number", low, high)


TEXT = FlagSpec("text")
SWITCH = FlagSpec("bool")


def _fits(value: Any, spec: FlagSpec) -> bool:
    if value is None:
        return True  # argparse's own "not given"
    if spec.kind == "bool":
        return isinstance(value, bool) or value in (0, 1)
    if spec.kind == "text":
        return isinstance(value, str) and len(value) <= MAX_TEXT
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if spec.kind == "int" and not isinstance(value, int):
        return False
    # Compared as numbers (a 400-digit int against a float bound is exact, no overflow); NaN fails.
    return not (isinstance(value, float) and math.isnan(value)) and spec.low <= value <= spec.high


def typed(args: Mapping[str, Any], specs: Mapping[str, FlagSpec],
          origin: str) -> Tuple[Dict[str, Any], List[Problem]]:
    """``args`` without the declared keys whose values do not fit, and one problem per dropped key
    (``origin`` names where the flags came from: "the log's server_args", "the bundle's flags")."""
    out: Dict[str, Any] = {}
    problems: List[Problem] = []
    for key, value in args.items():
        spec = specs.get(key)
        if spec is None or _fits(value, spec):
            out[key] = value
        else:
            problems.append(Problem("server_args.invalid", "{}: {}={} is not {}: treated as unknown".format(
                origin, key, _shown(value), _wanted(spec))))
    return out, problems


def _wanted(spec: FlagSpec) -> str:
    if spec.kind == "bool":
        return "true or false"
    if spec.kind == "text":
        return "text of at most {:,} characters".format(MAX_TEXT)
    what = "an integer" if spec.kind == "int" else "a number"
    return "{} in {}–{}".format(what, _bound(spec.low), _bound(spec.high))


def _bound(x: float) -> str:
    return "{:,}".format(int(x)) if x == int(x) else "{:g}".format(x)


def _shown(value: Any) -> str:
    """The value as it came, short and on one line (a forged one may be megabytes, or many lines)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return "<an integer of more than 20 digits>"  # repr of one over 4,300 digits would raise
    if isinstance(value, (dict, list)):
        return "<{} of {:,} item(s)>".format("an object" if isinstance(value, dict) else "a list", len(value))
    text = repr(value)
    short = " ".join(text[:80].split())
    return short if len(text) <= 80 else short[:77] + "..."
