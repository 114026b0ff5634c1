"""Which SGLang versions could have written a startup, from the shapes of its lines.

Each line shape narrows a version interval (its row in ``collectors/sglang/formats.py`` says
which releases print it); the interval picks the budget rules (research §2–§4).
Versions are tuples; the sampled releases bound each clue (research §0), so an interval
edge between two sampled releases is approximate, and the hint says so by being a range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Tuple

from kvforensics.collectors.lineformat import Version, version
from kvforensics.collectors.sglang.formats import BY_NAME
from kvforensics.collectors.sglang.startups import Startup

OLDEST: Version = (0, 2, 15)
NEWEST: Version = (0, 5, 23)


@dataclass(frozen=True)
class Era:
    """The SGLang versions that could have written a startup (low to high), and the line shapes that say so."""

    low: Version
    high: Version
    clues: Tuple[str, ...]

    def at_least(self, v: Version) -> bool:
        """True when every version in the interval is >= v."""
        return self.low >= v

    def at_most(self, v: Version) -> bool:
        return self.high <= v

    @property
    def hint(self) -> str:
        lo, hi = _fmt(self.low), _fmt(self.high)
        return lo if lo == hi else "{}–{}".format(lo, hi)


def _fmt(v: Version) -> str:
    return "{}.{}.{}".format(*v)


# Clues from the record prefix (timestamps, rank tags), before the message's own row.
_PREFIX_CLUES = (
    lambda ev: (None, version("0.3.0"), "time-only timestamps")
    if ev.ts and re.match(r"^\d{2}:\d{2}:\d{2}$", ev.ts) else
    (version("0.5.6"), None, "millisecond timestamps (SGLANG_LOG_MS)") if ev.ts and "." in ev.ts[10:] else None,
    lambda ev: (version("0.5.6"), None, "PP before TP in rank tags")
    if ev.rank and re.search(r"\bPP\d+ TP\d+", ev.rank) else None,
    lambda ev: (version("0.5.9"), None, "ATTN_CP/MOE_DP rank tags")
    if ev.rank and ("ATTN_CP" in ev.rank or "MOE_DP" in ev.rank) else None,
)


def detect(startup: Startup) -> Era:
    """Intersect the version ranges of every line shape the startup shows (in file order; a
    clue that contradicts the earlier ones — a custom build — is ignored)."""
    low, high = OLDEST, NEWEST
    clues: List[str] = []
    for ev in startup.events:
        row = BY_NAME.get(ev.fmt)
        found = [c(ev) for c in _PREFIX_CLUES] + [c(ev.data, ev.text) for c in (row.clues if row else ())]
        for clue in found:
            if clue is None:
                continue
            lo, hi, why = clue
            new_low = max(low, lo) if lo else low
            new_high = min(high, hi) if hi else high
            if new_low <= new_high:
                low, high = new_low, new_high
                clues.append(why)
    return Era(low, high, tuple(dict.fromkeys(clues)))
