"""Render recorded history: low-water free memory per GPU and rank, peak KV usage, sparklines."""

from __future__ import annotations

import datetime
from typing import Any, Dict, List, Optional, Sequence

GIB = 1 << 30
BLOCKS = "▁▂▃▄▅▆▇█"
SCHEMA = "kvforensics.history/1"


def sparkline(values: Sequence[Optional[int]], width: int = 40) -> str:
    """Free memory over time; each cell is the *lowest* value of its bucket (low-water view)."""
    known = [v for v in values if v is not None]
    if not known:
        return ""
    buckets: List[Optional[int]] = []
    n = len(values)
    cells = min(width, n)
    for i in range(cells):
        chunk = [v for v in values[i * n // cells:(i + 1) * n // cells] if v is not None]
        buckets.append(min(chunk) if chunk else None)
    lo, hi = min(known), max(known)
    out = []
    for v in buckets:
        if v is None:
            out.append(" ")
        elif hi == lo:
            out.append(BLOCKS[len(BLOCKS) // 2])
        else:
            out.append(BLOCKS[int((v - lo) / (hi - lo) * (len(BLOCKS) - 1))])
    return "".join(out)


def _when(ts: Optional[float]) -> str:
    if ts is None:
        return "?"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def to_json(path: str, since: str, runs: Sequence[Any]) -> Dict[str, Any]:
    return {"schema": SCHEMA, "db": path, "since": since, "runs": [{
        "run_key": r.run_key, "engine": r.engine, "model": r.model, "first_seen": r.first_seen,
        "last_seen": r.last_seen, "samples": r.samples, "kv_tokens": r.kv_tokens,
        "peak_used_tokens": r.peak_used_tokens, "peak_token_usage": r.peak_token_usage,
        "gpus": [{"gpu": g.gpu, "uuid": g.uuid, "rank": g.rank, "samples": g.samples,
                  "min_free_bytes": g.min_free_bytes, "max_free_bytes": g.max_free_bytes,
                  "last_free_bytes": g.last_free_bytes, "min_free_at": g.min_free_at} for g in r.gpus]}
        for r in runs]}


def render(path: str, since: str, runs: Sequence[Any], plots: Dict[int, List[Optional[int]]], color: bool = True,
           width: int = 110) -> str:
    from rich.table import Table

    from reports.terminal import console, text_of

    buf, c = console(color, width)
    c.print("kvforensics history · {} · last {} · {} engine run(s)".format(path, since, len(runs)))
    if not runs:
        c.print("  no samples in this window (kvforensics record adds them)")
    for r in runs:
        c.print("\nrun {} · {} · {} · {} → {} · {:,} samples".format(
            r.run_key, r.engine or "no engine", r.model or "", _when(r.first_seen), _when(r.last_seen), r.samples))
        if r.kv_tokens:
            usage = "—" if r.peak_token_usage is None else "{:.0%}".format(r.peak_token_usage)
            peak = ("peak {:,} tokens in use ({})".format(r.peak_used_tokens, usage)
                    if r.peak_used_tokens is not None else "no /metrics samples")
            c.print("  KV pool {:,} tokens; {}".format(r.kv_tokens, peak))
        table = Table(show_edge=False, pad_edge=False)
        for col, just in (("GPU", "right"), ("rank", "left"), ("samples", "right"), ("lowest free GiB", "right"),
                          ("when", "left"), ("highest", "right"), ("now", "right"), ("free over time (low-water)",
                                                                                     "left")):
            table.add_column(col, justify=just)  # type: ignore[arg-type]
        for g in r.gpus:
            table.add_row(str(g.gpu), g.rank or "—", "{:,}".format(g.samples),
                          "—" if g.min_free_bytes is None else "{:.2f}".format(g.min_free_bytes / GIB),
                          _when(g.min_free_at),
                          "—" if g.max_free_bytes is None else "{:.2f}".format(g.max_free_bytes / GIB),
                          "—" if g.last_free_bytes is None else "{:.2f}".format(g.last_free_bytes / GIB),
                          sparkline(plots.get(g.gpu, [])))
        c.print(table)
    return text_of(buf)
