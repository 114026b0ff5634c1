"""Which SGLang versions could have written a startup, from the shapes of its lines.

Each clue narrows a version interval; the interval picks the budget rules (research §2–§4).
Versions are tuples; the sampled releases bound each clue (research §0), so an interval
edge between two sampled releases is approximate, and the hint says so by being a range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

from collectors.sglang.startups import Startup

Version = Tuple[int, int, int]
OLDEST: Version = (0, 2, 15)
NEWEST: Version = (0, 5, 23)


@dataclass(frozen=True)
class Era:
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


def _v(text: str) -> Version:
    a, b, c = (int(x) for x in text.split("."))
    return (a, b, c)


def detect(startup: Startup) -> Era:
    low, high = OLDEST, NEWEST
    clues: List[str] = []

    def clue(lo: Optional[str], hi: Optional[str], why: str) -> None:
        nonlocal low, high
        new_low = max(low, _v(lo)) if lo else low
        new_high = min(high, _v(hi)) if hi else high
        if new_low <= new_high:  # contradicting clues (custom builds): keep the earlier ones
            low, high = new_low, new_high
            clues.append(why)

    for ev in startup.events:
        t, d = ev.text, ev.data
        if ev.ts and re.match(r"^\d{2}:\d{2}:\d{2}$", ev.ts):
            clue(None, "0.3.0", "time-only timestamps")
        elif ev.ts and "." in ev.ts[10:]:
            clue("0.5.6", None, "millisecond timestamps (SGLANG_LOG_MS)")
        if ev.rank and re.search(r"\bPP\d+ TP\d+", ev.rank):
            clue("0.5.6", None, "PP before TP in rank tags")
        if ev.rank and ("ATTN_CP" in ev.rank or "MOE_DP" in ev.rank):
            clue("0.5.9", None, "ATTN_CP/MOE_DP rank tags")
        if ev.kind == "dist_init_end":
            if d.get("baseline"):
                clue("0.5.21", None, "'Memory baseline taken'")
            elif "elapsed=" in t:
                clue("0.5.9", "0.5.20", "'Init torch distributed ends. elapsed='")
            else:
                clue("0.4.4", "0.5.8", "'Init torch distributed ends. mem usage'")
        elif ev.kind == "load_end":
            if d.get("used_bytes") is None:
                clue(None, "0.4.3", "'Load weight end' without mem usage")
            elif "elapsed=" not in t:
                clue("0.4.4", "0.5.8", "'Load weight end' with mem usage, no elapsed")
            elif d.get("dtype"):
                clue("0.5.9", "0.5.9", "'Load weight end. elapsed=…, dtype='")
            else:
                clue("0.5.10", None, "'Load weight end' without dtype")
        elif ev.kind == "kv_pool":
            if d.get("tokens") is None:
                clue("0.4.2", "0.4.3", "'KV Cache is allocated' without #tokens")
            elif d.get("dtype"):
                clue("0.5.13", None, "'KV Cache is allocated. dtype:'")
            else:
                clue("0.4.4", "0.5.12", "'KV Cache is allocated. #tokens:' without dtype")
            if d.get("layout") == "single" and d.get("tokens") is not None:
                clue("0.4.6", None, "MLA 'KV size' line")
            if d.get("label") or d.get("state") == "VA upper bound":
                clue("0.5.18", None, "labelled / VA-upper-bound KV pool line")
        elif ev.kind in ("graph_begin", "graph_end"):
            phase = d.get("phase", "")
            if "num_tokens_per_req" in t:
                clue("0.5.18", None, "'num_tokens_per_req' in graph line")
            elif "num_tokens_per_bs" in t:
                clue("0.5.14", "0.5.15", "'num_tokens_per_bs' in graph line")
            if phase.startswith(("target", "draft decode")) or "prefill" in phase:
                clue("0.5.14", None, "'Capture target|draft decode|prefill … CUDA graph'")
            elif "piecewise" in phase:
                clue("0.5.6", "0.5.13", "piecewise CUDA graph lines")
            if ev.kind == "graph_end" and "Time elapsed" in t and not d.get("draft"):
                if d.get("used_bytes") is None:
                    clue("0.4.0", "0.4.3", "graph end without mem usage")
                elif t.find("mem usage") < t.find("avail mem"):
                    clue("0.4.7", "0.5.13", "graph end 'mem usage' before 'avail mem'")
                else:
                    clue("0.4.4", "0.4.6", "graph end 'avail mem' before 'mem usage'")
        elif ev.kind == "summary":
            if d.get("avail_bytes") is not None:
                clue("0.4.7", None, "summary with available_gpu_mem")
            elif "chunked_prefill_size" in t:
                clue("0.4.2", "0.4.6", "summary with chunked_prefill_size, no available_gpu_mem")
            else:
                clue(None, "0.4.1", "summary without chunked_prefill_size")
        elif ev.kind == "kv_dtype":
            clue("0.5.3", "0.5.12", "'Using KV cache dtype'")
        elif ev.kind == "server_args":
            if ev.text.startswith("server_args={"):
                clue("0.5.19", None, "server_args printed as a dict")
            else:
                clue(None, "0.5.18", "server_args printed as ServerArgs(...)")
        elif ev.kind == "mamba_pool":
            clue("0.5.3", None, "'Mamba Cache is allocated'")
        elif ev.kind == "failure" and d.get("cause") == "weights_leave_no_memory":
            clue("0.5.14", None, "'Loaded weights leave no GPU memory'")
    return Era(low, high, tuple(dict.fromkeys(clues)))
